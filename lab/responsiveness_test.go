package lab

import "testing"

func TestGrades(t *testing.T) {
	for _, c := range []struct {
		added float64
		want  string
	}{{0, "A+"}, {4.9, "A+"}, {5, "A"}, {29, "A"}, {30, "B"}, {59.9, "B"}, {60, "C"}, {199, "C"}, {200, "D"}, {399, "D"}, {400, "F"}, {5000, "F"}} {
		if got := Grade(c.added); got != c.want {
			t.Errorf("%v ms added: %s, want %s", c.added, got, c.want)
		}
	}
}

// Each phase's probe is graded against the probe's quietest phase; RPM
// is 60,000 over the phase's 95% trimmed mean; a run of one phase has
// nothing to compare with.
func TestResponsiveness(t *testing.T) {
	samples := func(ms ...float64) []Sample {
		var out []Sample
		for _, v := range ms {
			out = append(out, Sample{RTT: v})
		}
		return out
	}
	idle := Summarize(samples(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1000)) // one stray
	loaded := Summarize(samples(40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40))
	r := &Result{Phases: []*PhaseResult{{Probes: map[string]*Latency{"ping": idle}}, {Probes: map[string]*Latency{"ping": loaded}}}}
	r.responsiveness()
	if x := idle.Responsiveness; x == nil || x.Grade != "A+" || x.RPM != 60000 || x.Added != 0 {
		t.Errorf("idle: %+v (TM95 %v: the stray 1 s sample is trimmed)", x, idle.TM95)
	}
	if x := loaded.Responsiveness; x == nil || x.Grade != "B" || x.RPM != 1500 || x.Added != 39 {
		t.Errorf("loaded: %+v", x)
	}
	if s := loaded.Responsiveness.String(); s != "1,500 RPM, grade B (+39.0 ms)" {
		t.Errorf("%q", s)
	}
	one := &Result{Phases: []*PhaseResult{{Probes: map[string]*Latency{"ping": Summarize(samples(3, 4))}}}}
	one.responsiveness()
	if x := one.Phases[0].Probes["ping"].Responsiveness; x != nil {
		t.Errorf("one phase: %+v", x)
	}
	if thousands(123456) != "123,456" || thousands(999) != "999" || thousands(1000) != "1,000" {
		t.Error(thousands(123456), thousands(999), thousands(1000))
	}
}
