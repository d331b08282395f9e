package records

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"
)

// The limits record: the runtime layer (the engine's limits) the kernel holds,
// beside the records of the trees. It is written before the kernel is
// touched (Pending names the objects whose kernel values may still lag
// behind it), and its limits stand while its writer keeps them: an
// agent holds the namespace's agent lock and the lease has not ended
// (the agent renews it at each controller step and ends it when it
// stops). A killed agent's lock goes with it, so the next apply puts
// the policy's values back at once; the lease bounds how long a record
// can stand should the lock be someone else's. Only the limits record says what
// differs from the trees' fingerprints at run time, so an apply reads
// those objects back whatever its path.

const (
	limitsFile    = "limits.json"
	limitsVersion = 1
	maxLimitsJSON = 16 << 20
)

// Limits is the limits file.
type Limits struct {
	Version int `json:"version"`
	// Holder is the process that wrote it, Until the end of its lease.
	Holder  int       `json:"holder"`
	Until   time.Time `json:"until"`
	Limits  []Limit   `json:"limits,omitempty"`
	Pending []string  `json:"pending,omitempty"`

	// held: an agent held the namespace's agent lock when it was read.
	held bool
}

// Limit is one limit as recorded (bytes/s): the record's own type,
// so that the planner's may change without changing the file. Target
// is the BPF target index for an EDT aggregate (0 for an HTB class),
// Host the class name of a host of an EDT group.
type Limit struct {
	Object string `json:"object"`
	Target uint32 `json:"target,omitempty"`
	Host   string `json:"host,omitempty"`
	Rate   uint64 `json:"rate_bytes_per_second,omitempty"`
	Ceil   uint64 `json:"ceil_bytes_per_second"`
}

// NewLimits records limits, held until until, with pending the objects
// whose kernel values may lag behind it. Both are sorted: the file is
// the same for the same limits.
func NewLimits(limits []Limit, until time.Time, pending []string) *Limits {
	r := &Limits{Version: limitsVersion, Holder: os.Getpid(), Until: until.UTC(), Limits: slices.Clone(limits),
		Pending: slices.Clone(pending), held: true}
	slices.SortFunc(r.Limits, func(a, b Limit) int {
		if c := strings.Compare(a.Object, b.Object); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Target, b.Target); c != 0 {
			return c
		}
		return strings.Compare(a.Host, b.Host)
	})
	slices.Sort(r.Pending)
	r.Pending = slices.Compact(r.Pending)
	return r
}

// Held reports whether the record's limits stand at now: an agent
// keeps them (it held the agent lock when the record was read, or
// wrote it) and the lease has not ended. A nil record holds nothing.
func (r *Limits) Held(now time.Time) bool {
	return r != nil && r.held && now.Before(r.Until) && len(r.Limits) > 0
}

// Touched returns the objects whose kernel values the record may have
// made differ from the policy's: those it limits (lease or not) and
// those pending.
func (r *Limits) Touched() []string {
	if r == nil {
		return nil
	}
	out := slices.Clone(r.Pending)
	for _, e := range r.Limits {
		out = append(out, e.Object)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// LoadLimits reads the limits record in dir (nil if there is none). A
// record that cannot be read or makes no sense is an error: the caller
// cannot tell what the kernel holds and reads every tree back.
func LoadLimits(dir string) (*Limits, error) {
	d, err := openDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.Close()
	b, err := d.ReadFile(limitsFile, maxLimitsJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &Error{d.Path(), err}
	}
	r := &Limits{held: AgentRunning(dir)}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, &Error{d.Path(), fmt.Errorf("%s: %w", limitsFile, err)}
	}
	if r.Version != limitsVersion {
		return nil, &Error{d.Path(), fmt.Errorf("%s: version %d, this sluice reads version %d", limitsFile, r.Version, limitsVersion)}
	}
	return r, nil
}

// SaveLimits writes r atomically in dir; nil removes the record.
func SaveLimits(dir string, r *Limits) error {
	d, err := openDir(dir, r != nil)
	if r == nil && errors.Is(err, fs.ErrNotExist) {
		return nil // nothing to remove
	}
	if err != nil {
		return err
	}
	defer d.Close()
	if r == nil {
		if err := d.Remove(limitsFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return d.WriteAtomic(limitsFile, append(b, '\n'))
}
