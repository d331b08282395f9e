package engine

import (
	"time"

	"sluice/plan"
	"sluice/records"
	"sluice/units"
)

// The limits record (records.Limits) keeps its own entry type, so that
// plan.Limits may change without changing the file: these two convert.

// limitsRecord records l, held until until, with pending the objects
// whose kernel values may lag behind it.
func limitsRecord(l plan.Limits, until time.Time, pending []string) *records.Limits {
	entries := make([]records.Limit, 0, len(l))
	for k, v := range l {
		entries = append(entries, records.Limit{Object: k.Object, Target: k.Target, Host: k.Host, Rate: uint64(v.Rate), Ceil: uint64(v.Ceil)})
	}
	return records.NewLimits(entries, until, pending)
}

// limitsInForce returns r's limits if they stand at now (records.Limits
// Held), nil otherwise.
func limitsInForce(r *records.Limits, now time.Time) plan.Limits {
	if !r.Held(now) {
		return nil
	}
	l := make(plan.Limits, len(r.Limits))
	for _, e := range r.Limits {
		l[plan.LimitKey{Object: e.Object, Target: e.Target, Host: e.Host}] = plan.Limit{Rate: units.Rate(e.Rate), Ceil: units.Rate(e.Ceil)}
	}
	return l
}
