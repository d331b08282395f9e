package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"time"

	"sluice/bpf"
	"sluice/plan"
	"sluice/tc"
	"sluice/units"
)

// The limits record: the runtime layer (plan.Limits) the kernel holds,
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

// LimitsRecord is the limits file.
type LimitsRecord struct {
	Version int `json:"version"`
	// Holder is the process that wrote it, Until the end of its lease.
	Holder  int          `json:"holder"`
	Until   time.Time    `json:"until"`
	Limits  []LimitEntry `json:"limits,omitempty"`
	Pending []string     `json:"pending,omitempty"`

	// held: an agent held the namespace's agent lock when it was read.
	held bool
}

// LimitEntry is one limit as recorded (bytes/s): the record's own type,
// so that the planner's may change without changing the file.
type LimitEntry struct {
	Object string `json:"object"`
	Target uint32 `json:"target,omitempty"`
	Rate   uint64 `json:"rate_bytes_per_second,omitempty"`
	Ceil   uint64 `json:"ceil_bytes_per_second"`
}

// NewLimitsRecord records l, held until until, with pending the objects
// whose kernel values may lag behind it.
func NewLimitsRecord(l plan.Limits, until time.Time, pending []string) *LimitsRecord {
	r := &LimitsRecord{Version: limitsVersion, Holder: os.Getpid(), Until: until.UTC(), Pending: pending, held: true}
	for k, v := range l {
		r.Limits = append(r.Limits, LimitEntry{Object: k.Object, Target: k.Target, Rate: uint64(v.Rate), Ceil: uint64(v.Ceil)})
	}
	slices.SortFunc(r.Limits, func(a, b LimitEntry) int {
		if a.Object != b.Object {
			if a.Object < b.Object {
				return -1
			}
			return 1
		}
		return int(a.Target) - int(b.Target)
	})
	slices.Sort(r.Pending)
	r.Pending = slices.Compact(r.Pending)
	return r
}

// InForce returns the recorded limits if an agent keeps them and the
// lease holds at now (nil otherwise, and for no record).
func (r *LimitsRecord) InForce(now time.Time) plan.Limits {
	if r == nil || !r.held || !now.Before(r.Until) || len(r.Limits) == 0 {
		return nil
	}
	return r.limits()
}

func (r *LimitsRecord) limits() plan.Limits {
	l := plan.Limits{}
	for _, e := range r.Limits {
		l[plan.LimitKey{Object: e.Object, Target: e.Target}] = plan.Limit{Rate: units.Rate(e.Rate), Ceil: units.Rate(e.Ceil)}
	}
	return l
}

// Touched returns the objects whose kernel values the record may have
// made differ from the policy's: those it limits (lease or not) and
// those pending.
func (r *LimitsRecord) Touched() []string {
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
func LoadLimits(dir string) (*LimitsRecord, error) {
	d, err := openStateDir(dir, false)
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
		return nil, &RecordsError{d.Path(), err}
	}
	r := &LimitsRecord{held: AgentRunning(dir)}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, &RecordsError{d.Path(), fmt.Errorf("%s: %w", limitsFile, err)}
	}
	if r.Version != limitsVersion {
		return nil, &RecordsError{d.Path(), fmt.Errorf("%s: version %d, this sluice reads version %d", limitsFile, r.Version, limitsVersion)}
	}
	return r, nil
}

// SaveLimits writes r atomically in dir; nil removes the record.
func SaveLimits(dir string, r *LimitsRecord) error {
	d, err := openStateDir(dir, r != nil)
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

// ReadLimited reads back the live counterparts of objs, the classes and
// classifiers a limits change writes (in that order; nil where one is
// gone).
func (k *Kernel) ReadLimited(objs []tc.Object) ([]tc.Object, error) {
	defer k.Conn.Pin()()
	out := make([]tc.Object, len(objs))
	for i, o := range objs {
		switch x := o.(type) {
		case *tc.Class:
			c, err := k.Conn.Class(x.Dev, x.Handle)
			if err != nil {
				return nil, err
			}
			if c != nil {
				out[i] = c
			}
		case *bpf.Hook:
			g, err := k.hookFilterOf(x)
			if err != nil {
				return nil, err
			}
			if g == nil {
				continue
			}
			h, err := readHookProgram(x.Dev, x.Ingress, g)
			if err != nil {
				return nil, err
			}
			out[i] = h
		default:
			return nil, fmt.Errorf("%s: not something a limit applies to", o.Describe())
		}
	}
	return out, nil
}

// ApplyPatch carries out d, a change of values in place (limits over
// the objects ReadLimited read, host entries: HostsDiff), with Apply's
// rollback. Under -tags faults, SLUICE_FAULTS=kill-at-patch-write=N
// kills the process at its N-th write.
func (k *Kernel) ApplyPatch(d *Diff) (*Result, error) {
	for _, c := range d.Changes {
		if c.Verb != tc.Change {
			return nil, fmt.Errorf("a patch cannot %s %s", c.Verb, c.Obj.Describe())
		}
	}
	defer patchFaults(k)()
	return k.Apply(d)
}
