package conform

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand"
	"sort"
	"strings"
	"time"

	"sluice/lab"
	"sluice/plan"
	"sluice/policy"
	"sluice/share"
	"sluice/stats"
	"sluice/units"
)

// Demand is what one subject sends in a cell: Flows greedy TCP flows, or
// one flow sent at Rate (bits/s on the wire, as the shaper counts them):
// UDP datagrams ("udp"), small pure TCP ACKs ("ack") or bare SYNs ("syn").
type Demand struct {
	Subject string  `json:"subject"`
	Proto   string  `json:"proto"`
	Flows   int     `json:"flows"`
	Rate    float64 `json:"rate_bps,omitempty"`
}

// Cell is one demand pattern: which subjects send, and how.
type Cell struct {
	Name    string   `json:"name"`
	Demands []Demand `json:"demands"`
}

// Describe says what a demand is, in a table's words.
func (d Demand) Describe() string {
	switch d.Proto {
	case "udp":
		return "udp " + units.Bits(d.Rate)
	case "ack":
		return "acks " + units.Bits(d.Rate)
	case "syn":
		return "syns " + units.Bits(d.Rate)
	}
	return fmt.Sprintf("tcp x%d", d.Flows)
}

// Senders at a rate send at most this many packets a second: what a Go
// sender keeps up with on an emulated guest's core. A class a rated flow
// cannot fill is judged with the demand it sent (a demand that fits).
const (
	maxUDPPackets = 40000
	maxACKPackets = 20000
)

// GreedyDemand is a demand that wants more than subject s can get on a link
// of link bits/s: flows greedy TCP flows, or for a subject only a rated
// flow reaches (UDP, pure ACKs), its flow at a quarter past its ceil,
// as fast as a sender keeps up at most.
func GreedyDemand(s *Subject, flows int, link float64) Demand {
	if len(s.Flows) == 0 || s.Flows[0].Greedy() {
		return Demand{Subject: s.Name, Proto: "tcp", Flows: flows}
	}
	f := s.Flows[0]
	want := 1.25 * min(s.Ceil, link)
	if s.Ceil <= 0 {
		want = 1.25 * link
	}
	return Demand{Subject: s.Name, Proto: f.Proto, Flows: 1, Rate: min(want, maxRate(f))}
}

// maxRate is the most bits/s on the wire a rated flow f is sent at.
func maxRate(f Flow) float64 {
	if rawTCP(f.Proto) {
		return maxACKPackets * float64(lab.ACKFrame(f.Dst.Addr().Is6())) * 8
	}
	return maxUDPPackets * float64(udpFrame) * 8
}

// frame is the size on the wire of the packets of a rated demand.
func (d Demand) frame(v6 bool) int {
	if rawTCP(d.Proto) {
		return lab.ACKFrame(v6)
	}
	return udpFrame
}

// rawTCP reports whether flows of proto are TCP segments sent raw at a
// rate (ACKs, SYNs), with no connection.
func rawTCP(proto string) bool { return proto == "ack" || proto == "syn" }

// autoCells lists the demand patterns of a tree whose driven subjects
// are ss: all at once; each alone (four of them, spread, beyond six);
// every subset of two or more (for up to four subjects; else four
// drawn at random, the same for the same tree); one heavy subject with
// eight flows against the others with one; and the first subject with a
// UDP flow sending half its share of the link while the others are
// greedy, so that the others must take what it leaves.
func autoCells(t *policy.Tree, tree string, ss []*Subject) []Cell {
	n := len(ss)
	if n == 0 {
		return nil
	}
	link := bits(t.RateBps)
	tcp := func(idx ...int) []Demand {
		var ds []Demand
		for _, i := range idx {
			ds = append(ds, GreedyDemand(ss[i], 1, link))
		}
		return ds
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	cells := []Cell{{Name: "all", Demands: tcp(all...)}}
	if n == 1 {
		return cells
	}
	alone := all
	if n > 6 {
		alone = []int{0, n / 3, 2 * n / 3, n - 1}
	}
	for _, i := range alone {
		cells = append(cells, Cell{Name: ss[i].Name + " alone", Demands: tcp(i)})
	}
	var subsets [][]int
	if n <= 4 {
		for mask := 1; mask < 1<<n-1; mask++ {
			var idx []int
			for i := 0; i < n; i++ {
				if mask&(1<<i) != 0 {
					idx = append(idx, i)
				}
			}
			if len(idx) >= 2 {
				subsets = append(subsets, idx)
			}
		}
	} else {
		h := fnv.New64a()
		h.Write([]byte(tree))
		r := rand.New(rand.NewSource(int64(h.Sum64())))
		seen := map[string]bool{}
		for tries := 0; len(subsets) < 4 && tries < 100; tries++ {
			idx := r.Perm(n)[:2+r.Intn(n-2)]
			sort.Ints(idx)
			if key := fmt.Sprint(idx); !seen[key] {
				seen[key] = true
				subsets = append(subsets, idx)
			}
		}
	}
	for _, idx := range subsets {
		var names []string
		for _, i := range idx {
			names = append(names, ss[i].Name)
		}
		cells = append(cells, Cell{Name: strings.Join(names, " + "), Demands: tcp(idx...)})
	}
	// The heavy subject: the first that TCP drives with many flows.
	for i, s := range ss {
		heavy := tcp(all...)
		if heavy[i].Proto != "tcp" || len(s.Flows) < 2 {
			continue
		}
		heavy[i].Flows = min(maxFlows, len(s.Flows))
		cells = append(cells, Cell{Name: s.Name + " with " + fmt.Sprint(heavy[i].Flows) + " flows", Demands: heavy})
		break
	}
	for i, s := range ss {
		if s.UDP == nil {
			continue
		}
		// Half its share when all are busy: a demand that fits, whose
		// rest the others must take.
		ideal, err := Reference(t, ss, Cell{Demands: tcp(all...)})
		if err != nil || ideal[s.Name] <= 0 {
			break
		}
		ds := tcp(all...)
		ds[i] = Demand{Subject: s.Name, Proto: "udp", Flows: 1, Rate: ideal[s.Name] / 2}
		cells = append(cells, Cell{Name: s.Name + " udp at half its share", Demands: ds})
		break
	}
	return cells
}

// Reference is the weighted max-min ideal (share.Ideal) for a cell:
// what every subject of tree t would get, in bits/s on the wire.
func Reference(t *policy.Tree, ss []*Subject, c Cell) (map[string]float64, error) {
	return ReferenceAt(t, ss, c, bits(t.RateBps))
}

// ReferenceAt is Reference for a link that carries capacity (bits/s)
// in all instead of the tree's rate, every class's rate and ceil as
// configured: what each subject's part is of what the tree carried.
// Conformance judges shares by it. A bed whose late timers cost the
// root a few per cent (98.3% of its rate in the emulated 6.1 lane)
// still gives a capped class all of its ceil (2.999 to 3.005 of 3
// Mbit/s in five runs): against the nominal reference that subject's
// share of the smaller total read 1.7% high.
func ReferenceAt(t *policy.Tree, ss []*Subject, c Cell, capacity float64) (map[string]float64, error) {
	demand := map[string]float64{}
	for _, d := range c.Demands {
		switch d.Proto {
		case "udp", "ack", "syn":
			demand[d.Subject] = counted(t, d.Rate, d.frame(false))
		default:
			demand[d.Subject] = math.Inf(1)
		}
	}
	got, err := share.Ideal(refTree(t, ss, demand, capacity))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range ss {
		out[s.Name] = got[s.Name]
	}
	return out, nil
}

// udpFrame is the frame conformance's UDP flows send: 1200 bytes of
// payload, 42 of UDP, IPv4 and Ethernet headers (run.go).
const udpFrame = 1242

// counted is a rated demand of rate (bits/s of frames of size frame)
// as tree t's counters count it: with a link layer (a size table) a
// frame counts as the cells that carry it, 1431 bytes for 1242 on ATM
// with 26 of overhead, and the reference must want what the shaper
// charges.
func counted(t *policy.Tree, rate float64, frame int) float64 {
	st := plan.LinkStab(t)
	if st == nil {
		return rate
	}
	return rate * float64(st.Size(frame)) / float64(frame)
}

// ClassReference is the weighted max-min ideal (bits/s) for tree t's
// classes when the classes demand maps (leaf class name to bits/s,
// +Inf for a greedy sender) send: what the policy promises them.
func ClassReference(t *policy.Tree, demand map[string]float64) (map[string]float64, error) {
	return share.Ideal(refTree(t, nil, demand, bits(t.RateBps)))
}

// refTree is tree t as the reference sees it: every class, with the
// hosts among the subjects below their parents, and each leaf's demand;
// its root carries link bits/s.
func refTree(t *policy.Tree, ss []*Subject, demand map[string]float64, link float64) *share.Class {
	// HTB orders borrowing by the leaves' prios at every level; EDT's
	// aggregates by their own.
	root := &share.Class{Name: "(root)", Rate: link, Ceil: link, LeafPrio: !t.EDT()}
	hostsUnder := map[*policy.Class][]*Subject{}
	for _, s := range ss {
		if s.host {
			hostsUnder[s.parent] = append(hostsUnder[s.parent], s)
		}
	}
	var build func(parent *share.Class, cs []*policy.Class, sh *policy.Sharing)
	build = func(parent *share.Class, cs []*policy.Class, sh *policy.Sharing) {
		prios := map[int]bool{}
		for _, c := range cs {
			prios[c.Prio] = true
		}
		if sh != nil && sh.CapBps > 0 {
			parent.Cap = bits(sh.CapBps)
		}
		for _, c := range cs {
			n := &share.Class{Name: c.Name, Rate: bits(c.RateBps), Ceil: classCeil(c), Prio: c.Prio,
				Weight: max(c.ShareWeight(), 1e-9), Demand: demand[c.Name]}
			n.Prod = sh != nil && c.Prio == 0 && len(prios) > 1
			for _, h := range hostsUnder[c] {
				// A host weighs its rate in the units a class's weight
				// is (ShareWeight: bytes/s), as the plan's quanta weigh
				// them: a groups_file's groups are siblings of hosts.
				n.Children = append(n.Children, &share.Class{Name: h.Name, Rate: h.Rate, Ceil: h.Ceil, Prio: h.Prio,
					Weight: max(h.Rate/8, 1e-9), Demand: demand[h.Name]})
			}
			build(n, c.Classes, c.Sharing)
			parent.Children = append(parent.Children, n)
		}
	}
	build(root, t.Classes, t.Sharing)
	return root
}

// Verdict says how a cell's measurement compares with the reference.
type Verdict struct {
	// Subjects in the cell's order: ideal and measured rates (bits/s on
	// the wire), their shares of the cell's ideal and measured totals,
	// and the deviation between the shares.
	Subjects []SubjectResult `json:"subjects"`
	// IdealTotal and MeasuredTotal add up the subjects; Utilisation is
	// MeasuredTotal against IdealTotal, corrected by what a plain limit
	// carried on the same bed (Efficiency).
	IdealTotal    float64 `json:"ideal_total_bps"`
	MeasuredTotal float64 `json:"measured_total_bps"`
	Efficiency    float64 `json:"efficiency"`
	Utilisation   float64 `json:"utilisation"`
	// Worst is the largest deviation, of subject WorstSubject.
	Worst        float64 `json:"worst"`
	WorstSubject string  `json:"worst_subject"`
	Pass         bool    `json:"pass"`
	Why          string  `json:"why,omitempty"`
	// Strays is what landed in classes the cell does not drive (bits/s),
	// where more than 2% of what it carried: it fails the cell.
	Strays float64 `json:"strays_bps,omitempty"`
	// Notes say how the cell was judged where it differs from its
	// demands (a sender that fell short).
	Notes []string `json:"notes,omitempty"`
}

// SubjectResult is one subject of a cell.
type SubjectResult struct {
	Name          string  `json:"name"`
	Demand        string  `json:"demand"`
	Ideal         float64 `json:"ideal_bps"`
	Measured      float64 `json:"measured_bps"`
	Goodput       float64 `json:"goodput_bps"`
	IdealShare    float64 `json:"ideal_share"`
	MeasuredShare float64 `json:"measured_share"`
	Deviation     float64 `json:"deviation"`
	// RTT is the subject's TCP round trips over the measurement, timed
	// from its own packets (nil: it timed none, as UDP does).
	RTT *SubjectRTT `json:"rtt,omitempty"`
}

// SubjectRTT is a subject's round trips in a cell: how many were timed,
// their median and 95th percentile (seconds), the responsiveness the
// median gives in round trips per minute, and what the cell's load added
// to the bed's own round trip (its delay line), with its bufferbloat
// grade (lab.Grade). With fewer than stats.MinRTTSamples the quantiles
// are left out: too few to say.
type SubjectRTT struct {
	Samples uint64  `json:"samples"`
	P50     float64 `json:"p50_seconds,omitempty"`
	P95     float64 `json:"p95_seconds,omitempty"`
	RPM     float64 `json:"rpm,omitempty"`
	Added   float64 `json:"added_seconds,omitempty"`
	Grade   string  `json:"grade,omitempty"`
}

// subjectRTT is what a cell reports of round trips r (nil for none) on
// a bed whose own round trip is bed.
func subjectRTT(r *stats.RTT, bed time.Duration) *SubjectRTT {
	if r == nil || r.Samples == 0 {
		return nil
	}
	s := &SubjectRTT{Samples: r.Samples}
	if r.Enough() {
		s.P50, s.P95 = r.P50, r.P95
		if r.P50 > 0 {
			s.RPM = 60 / r.P50
		}
		s.Added = max(0, r.P50-bed.Seconds())
		s.Grade = lab.Grade(1000 * s.Added)
	}
	return s
}

// Text is the round trips as a report's table says them: "p50 / p95
// ms", "few (N)" below the samples quantiles need, "-" for none.
func (s *SubjectRTT) Text() string {
	switch {
	case s == nil:
		return "-"
	case s.P50 == 0:
		return fmt.Sprintf("few (%d)", s.Samples)
	}
	return fmt.Sprintf("%.1f / %.1f ms (%s)", 1000*s.P50, 1000*s.P95, s.Grade)
}

// Tolerance is how far a cell may stray from the reference: each
// subject's share of the measured total within 5% of its ideal share,
// and the total at least 95% of what the reference wants after the
// bed's own efficiency (what a plain limit carried), at most 105% of
// what it wants at the nominal rates (a shaper must not pass more; a
// reference run that carried less than the bed can is no reason to
// fail a cell that carried more).
const Tolerance = 0.05

// minPackets is how many full-size packets a cell's window holds for
// the smallest share it judges. The counters move by whole packets and
// HTB hands a borrowing class its quantum per turn (three frames at low
// rates), so a window's edges shift a share by up to a turn: with 50
// packets that is 6% of the share, and examples/per-user.yaml's three
// hosts at 2 Mbit/s (110 packets each in 2 s) read 1.2 to 3.0% from
// the reference in seven runs and 5.8% twice in a row in CI; in 4 s,
// 0.5 to 2.0%. At 200 a turn of three frames is 1.5% of the share.
const minPackets = 200

// minTotalPackets is how many full-size packets a cell of one subject
// holds: its total is judged to 5% of itself, and at 50 a packet more
// or less at the window's edges is 2% of it. Sized for shares (200),
// the EDT examples' hosts alone took 7 s a cell in the 6.1 lane where
// 2 s had passed in every run.
const minTotalPackets = 50

// maxWindow bounds how far Window stretches a cell's measurement: two
// minutes, which judge a 25 kbit/s share of a 200 kbit/s link. At
// four times the measure time instead, examples/wondershaper.yaml's
// 22 kbit/s interactive class at 220 kbit/s held 22 packets in 12 s and
// read 6 to 13% from the reference from one run to the next; in the
// 89 s its shares need, 0.0 to 0.5% in every cell.
const maxWindow = 2 * time.Minute

// Window is how long to measure cell c: measure, or longer where the
// smallest share it judges would send fewer than minPackets full-size
// packets in it (at most maxWindow), in whole seconds. A share is
// judged to no finer than a quarter of an equal share of the cell's
// total (Judge), so a class the reference gives a sliver needs a
// window for that quarter, not for its sliver. A cell of one subject
// has no share to judge (its share is the whole), only its total, to 5%
// of itself: minTotalPackets of it.
func Window(measure time.Duration, c Cell, ideal map[string]float64) time.Duration {
	total := 0.0
	for _, d := range c.Demands {
		total += ideal[d.Subject]
	}
	if total <= 0 {
		return measure
	}
	least, packets := total, float64(minTotalPackets)
	if len(c.Demands) > 1 {
		floor := total / (4 * float64(len(c.Demands)))
		least, packets = math.Inf(1), minPackets
		for _, d := range c.Demands {
			if x := ideal[d.Subject]; x > 0 {
				least = min(least, max(x, floor))
			}
		}
	}
	need := time.Duration(math.Ceil(packets*1514*8/least)) * time.Second
	return max(measure, min(need, maxWindow))
}

// Judge compares measured rates (bits/s on the wire, by subject) with
// the ideal ones: the cell's total with ideal (the reference at the
// tree's rate), each subject's share with carried (the reference at
// what the tree carried in all, ReferenceAt; ideal where nil). A
// subject's deviation is the difference between its measured and ideal
// shares of the cell's totals, relative to its ideal share, but never
// finer than a quarter of an equal share: a class the reference gives
// 0.5% of the link is judged to 5% of an eighth of it, not to 5% of its
// own sliver. eff is what a plain limit at the link's rate carried on
// the bed, over that rate (1 on an exact machine).
func Judge(c Cell, ideal, carried, measured, goodput map[string]float64, eff float64) Verdict {
	v := Verdict{Efficiency: eff}
	if carried == nil {
		carried = ideal
	}
	shareTotal := 0.0
	for _, d := range c.Demands {
		v.IdealTotal += ideal[d.Subject]
		v.MeasuredTotal += measured[d.Subject]
		shareTotal += carried[d.Subject]
	}
	n := float64(len(c.Demands))
	floor := 1 / (4 * n)
	for _, d := range c.Demands {
		r := SubjectResult{Name: d.Subject, Demand: d.Describe(), Ideal: carried[d.Subject], Measured: measured[d.Subject], Goodput: goodput[d.Subject]}
		if shareTotal > 0 {
			r.IdealShare = r.Ideal / shareTotal
		}
		if v.MeasuredTotal > 0 {
			r.MeasuredShare = r.Measured / v.MeasuredTotal
		}
		r.Deviation = math.Abs(r.MeasuredShare-r.IdealShare) / math.Max(r.IdealShare, floor)
		if !(r.Deviation <= v.Worst) { // NaN counts as worst
			v.Worst, v.WorstSubject = r.Deviation, r.Name
		}
		v.Subjects = append(v.Subjects, r)
	}
	if v.IdealTotal > 0 && eff > 0 {
		v.Utilisation = v.MeasuredTotal / (v.IdealTotal * eff)
	}
	switch {
	case !(v.Worst <= Tolerance):
		v.Why = fmt.Sprintf("%s: %.1f%% of the total, the reference says %.1f%%", v.WorstSubject,
			100*shareOf(v, v.WorstSubject, true), 100*shareOf(v, v.WorstSubject, false))
	case !(v.Utilisation >= 1-Tolerance):
		v.Why = fmt.Sprintf("together %s where the reference (at this bed's %.0f%%) says %s", units.Bits(v.MeasuredTotal), 100*eff, units.Bits(v.IdealTotal*eff))
	case !(v.MeasuredTotal <= v.IdealTotal*(1+Tolerance)):
		v.Why = fmt.Sprintf("together %s, more than the reference's %s", units.Bits(v.MeasuredTotal), units.Bits(v.IdealTotal))
	default:
		v.Pass = true
	}
	return v
}

func shareOf(v Verdict, name string, measured bool) float64 {
	for _, s := range v.Subjects {
		if s.Name == name {
			if measured {
				return s.MeasuredShare
			}
			return s.IdealShare
		}
	}
	return 0
}
