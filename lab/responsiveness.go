package lab

import "fmt"

// Responsiveness is how a phase's round trips feel: in round trips per
// minute (RPM), the IETF's "Responsiveness under Working Conditions"
// unit, and as the bufferbloat grade operators know, from the latency
// the phase added to the run's quietest.
//
// Where the method differs from the draft's: the draft times TCP
// handshakes, TLS handshakes and HTTP/2 requests on connections of its
// own and on the loaded ones (foreign and self probes), and takes a
// 95% trimmed mean of each; here it is the lab's probe (ping, or its
// TCP or UDP request and response), one kind, on a connection of its
// own: a foreign probe only. RPM = 60,000 / TM95 in ms.
type Responsiveness struct {
	RPM float64 `json:"rpm"`
	// Added is the phase's TM95 above the quietest phase's median (ms),
	// which Grade grades.
	Added float64 `json:"added_ms"`
	Grade string  `json:"grade"`
}

// grades are the bufferbloat grades by the latency load adds: under 5
// ms A+, 30 A, 60 B, 200 C, 400 D, else F (the scale of Waveform's
// bufferbloat test, which DSLReports' used before it).
var grades = []struct {
	below float64
	grade string
}{{5, "A+"}, {30, "A"}, {60, "B"}, {200, "C"}, {400, "D"}}

// Grade is the bufferbloat grade of a latency added under load (ms).
func Grade(added float64) string {
	for _, g := range grades {
		if added < g.below {
			return g.grade
		}
	}
	return "F"
}

// responsiveness grades each probe in each phase against the probe's
// quietest phase (the lowest median: where the link idles), if the run
// has more than one phase with samples.
func (r *Result) responsiveness() {
	base := map[string]float64{}
	phases := map[string]int{}
	for _, p := range r.Phases {
		for name, l := range p.Probes {
			if l == nil || l.N == 0 {
				continue
			}
			phases[name]++
			if b, ok := base[name]; !ok || l.P50 < b {
				base[name] = l.P50
			}
		}
	}
	for _, p := range r.Phases {
		for name, l := range p.Probes {
			if l == nil || l.N == 0 || phases[name] < 2 || l.TM95 <= 0 {
				continue
			}
			added := max(0, l.TM95-base[name])
			l.Responsiveness = &Responsiveness{RPM: 60000 / l.TM95, Added: added, Grade: Grade(added)}
		}
	}
}

// String is "2,400 RPM, grade A (+3.2 ms)".
func (x *Responsiveness) String() string {
	return fmt.Sprintf("%s RPM, grade %s (+%s)", thousands(x.RPM), x.Grade, ms(x.Added))
}

// thousands prints a whole number with commas.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
