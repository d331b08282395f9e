package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sluice/policy"
	"sluice/safefile"
)

// SavedPlan is what `plan --out FILE` writes for a later `apply FILE`:
// the policy as it was planned (its source, so that an edit made after
// the plan does not slip in), the namespace, and the changes the plan
// showed, each by its ID (kernel.Change.ID). Applied, it makes exactly
// those changes or none: a kernel, records or hosts file that moved
// since then needs other changes, and the apply is refused.
type SavedPlan struct {
	Format  int       `json:"sluice_plan"` // SavedPlanFormat
	Created time.Time `json:"created"`
	File    string    `json:"policy_file"` // absolute: records name it
	Source  string    `json:"policy"`
	Netns   string    `json:"netns,omitempty"`
	Force   bool      `json:"force,omitempty"`
	// Changes are the plan's lines as `plan` printed them (for people),
	// IDs what the apply compares.
	Changes []string `json:"changes"`
	IDs     []string `json:"ids"`
}

// SavedPlanFormat is the saved plan's format version.
const SavedPlanFormat = 1

// maxSavedPlan bounds a saved plan's size: a policy and a change per
// object.
const maxSavedPlan = 4 * policy.MaxPolicyBytes

// PlanToSave plans file as Plan does, reading it once, and returns what
// `plan --out` writes along with the plan. lines renders the diff as
// plan prints it.
func PlanToSave(file string, opts Options, lines func(*Prepared) []string) (*Prepared, *SavedPlan, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, nil, input(err)
	}
	src, err := safefile.ReadRegular(abs, "policy", policy.MaxPolicyBytes)
	if err != nil {
		return nil, nil, input(err)
	}
	pol, err := parse(abs, src, opts)
	if err != nil {
		return nil, nil, err
	}
	p, err := PlanPolicy(pol, opts)
	if err != nil {
		return nil, nil, err
	}
	s := &SavedPlan{Format: SavedPlanFormat, Created: time.Now().UTC(), File: abs, Source: string(src),
		Netns: opts.Netns, Force: opts.Force, Changes: lines(p)}
	for _, c := range p.Diff.Changes {
		s.IDs = append(s.IDs, c.ID())
	}
	return p, s, nil
}

// parse reads and checks a policy from its source, passing its
// warnings on (Load for bytes already read).
func parse(file string, src []byte, opts Options) (*policy.Policy, error) {
	p, warns, err := policy.Parse(file, src)
	return checked(file, p, warns, err, opts)
}

// Write writes s to path, as a new file or over a regular one, never
// through a symbolic link, readable by its owner alone (a policy names
// subscribers).
func (s *SavedPlan) Write(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := safefile.WriteOut(path, append(b, '\n'), 0o600); err != nil {
		if errors.Is(err, safefile.ErrUnsafe) {
			return input(fmt.Errorf("plan --out: %w", err))
		}
		return fmt.Errorf("plan --out: %w", err)
	}
	return nil
}

// ReadSavedPlan reads path as a saved plan. ok is false when it is not
// one (a policy, for instance), and err says what is wrong with one
// that is.
func ReadSavedPlan(path string) (s *SavedPlan, ok bool, err error) {
	b, err := safefile.ReadRegular(path, "plan", maxSavedPlan)
	if err != nil {
		return nil, false, nil // apply reports it as a policy would be
	}
	var probe struct {
		Format *int `json:"sluice_plan"`
	}
	if json.Unmarshal(b, &probe) != nil || probe.Format == nil {
		return nil, false, nil
	}
	s = &SavedPlan{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, true, input(fmt.Errorf("%s: a saved plan that cannot be read: %v", path, err))
	}
	if s.Format != SavedPlanFormat {
		return nil, true, input(fmt.Errorf("%s: a saved plan of format %d; this sluice reads format %d: run plan again", path, s.Format, SavedPlanFormat))
	}
	if len(s.Changes) != len(s.IDs) || s.File == "" || !filepath.IsAbs(s.File) {
		return nil, true, input(fmt.Errorf("%s: a saved plan that is not whole (edited by hand?): run plan again", path))
	}
	return s, true, nil
}

// StalePlanError says a saved plan no longer matches what the kernel
// needs: nothing was changed.
type StalePlanError struct {
	Path string
	// Planned and Now are the changes the plan showed and those the
	// policy needs now (plan's lines), Gone and New where they differ.
	Gone, New []string
}

func (e *StalePlanError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the kernel moved since this plan was made: it now needs other changes; nothing was changed (run plan again)", e.Path)
	show := func(what string, lines []string) {
		for i, l := range lines {
			if i == 5 {
				fmt.Fprintf(&b, "\n  ... and %d more", len(lines)-5)
				break
			}
			fmt.Fprintf(&b, "\n  %s %s", what, l)
		}
	}
	show("planned, no longer needed as planned:", e.Gone)
	show("needed now, not in the plan:", e.New)
	return b.String()
}

// PrepareSaved prepares saved plan s (read from path) for an apply: the
// policy as it was planned, against every object read back (as plan
// read them), under the namespace's lock. It fails with a
// StalePlanError unless the changes are the plan's, in its order.
// lines renders a diff as plan prints it.
func PrepareSaved(path string, s *SavedPlan, opts Options, lines func(*Prepared) []string) (*Prepared, error) {
	if s.Netns != opts.Netns {
		where := func(ns string) string {
			if ns == "" {
				return "the current namespace"
			}
			return "namespace " + ns
		}
		return nil, input(fmt.Errorf("%s: planned for %s, applied in %s", path, where(s.Netns), where(opts.Netns)))
	}
	pol, err := parse(s.File, []byte(s.Source), opts)
	if err != nil {
		return nil, err
	}
	opts.Full, opts.Force = true, s.Force
	p, err := PreparePolicy(pol, opts)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range p.Diff.Changes {
		ids = append(ids, c.ID())
	}
	if slices.Equal(ids, s.IDs) {
		return p, nil
	}
	now := lines(p)
	p.Close()
	stale := &StalePlanError{Path: path}
	planned := map[string]bool{}
	for _, id := range s.IDs {
		planned[id] = true
	}
	current := map[string]bool{}
	for i, id := range ids {
		current[id] = true
		if !planned[id] && i < len(now) {
			stale.New = append(stale.New, now[i])
		}
	}
	for i, id := range s.IDs {
		if !current[id] {
			stale.Gone = append(stale.Gone, s.Changes[i])
		}
	}
	if len(stale.Gone)+len(stale.New) == 0 { // the same changes, in another order
		stale.New = []string{"(the same changes, in another order)"}
	}
	return nil, stale
}
