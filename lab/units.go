package lab

import (
	"sluice/policy"
	"sluice/units"
)

// parseRate reads a rate in tc's units and returns bytes per second.
func parseRate(s string) (units.Rate, error) {
	r, _, err := policy.ParseRate(s)
	if err != nil {
		return 0, err
	}
	if r.Percent > 0 {
		return 0, errPercent
	}
	return r.Bps, nil
}

type labError string

func (e labError) Error() string { return string(e) }

const errPercent = labError("a percentage needs a parent; give an absolute rate")
