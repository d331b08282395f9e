package lab

import (
	"bytes"

	"gopkg.in/yaml.v3"

	"sluice/bpf"
)

// The lab times every shaped class's TCP round trips from its own
// packets (an interface's `rtt: on`), so that each phase of a report
// gives the passive figure beside the probes' pings.

// withRTT returns policy text with `rtt: on` on every interface that
// does not say otherwise (an `rtt:` of its own, off included, stays).
// Text it cannot read as YAML it returns as it is: applying it will say
// what is wrong.
func withRTT(text string) string {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return text
	}
	top := doc.Content[0]
	changed := false
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "interfaces" || top.Content[i+1].Kind != yaml.SequenceNode {
			continue
		}
		for _, in := range top.Content[i+1].Content {
			if in.Kind != yaml.MappingNode {
				continue
			}
			has := false
			for j := 0; j+1 < len(in.Content); j += 2 {
				has = has || in.Content[j].Value == "rtt"
			}
			if !has {
				in.Content = append(in.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "rtt"}, &yaml.Node{Kind: yaml.ScalarNode, Value: "on"})
				changed = true
			}
		}
	}
	if !changed {
		return text
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return text
	}
	return b.String()
}

// RTTStat is a class's round trips over a phase, timed from its own TCP
// packets: how many, their median, 95th percentile and mean (ms), and
// the mean split at the shaper: the part spent in the class's own queue
// (Queue) and the rest, the path beyond it (Path).
//
// Queue is the qdisc's view, by Little's law: the class's mean backlog
// over the phase's readings divided by what it passed (an EDT
// aggregate's backlog is its clock's lead at its cap, so this is the
// lead). A sample is timed from the moment sluice classifies its packet,
// before the queue, so its mean is the queue's mean sojourn plus the
// path's: Path = Mean - Queue.
type RTTStat struct {
	Samples uint64  `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P95     float64 `json:"p95_ms"`
	Mean    float64 `json:"mean_ms"`
	Queue   float64 `json:"queue_ms"`
	Path    float64 `json:"path_ms"`
}

// rttOver is what class c's cumulative histograms (one per bucket, nil
// where unread) gained from bucket lo to hi, or nil without a reading.
func (c *ClassSeries) rttOver(lo, hi int) *RTTStat {
	at := func(i int) *bpf.RTTHist {
		for ; i >= 0; i-- {
			if i < len(c.rtt) && c.rtt[i] != nil {
				return c.rtt[i]
			}
		}
		return nil
	}
	end := at(hi - 1)
	if end == nil {
		return nil
	}
	d := *end
	if start := at(lo - 1); start != nil {
		for k := range d.B {
			d.B[k] -= min(d.B[k], start.B[k])
		}
		d.Count -= min(d.Count, start.Count)
		d.Sum -= min(d.Sum, start.Sum)
	}
	s := &RTTStat{Samples: d.Count}
	if d.Count > 0 {
		s.Mean = float64(d.Sum) / float64(d.Count) / 1e6
		s.Queue = c.queueOver(lo, hi)
		s.Path = max(0, s.Mean-s.Queue)
	}
	if p, ok := bpf.Quantile(&d, 0.5); ok {
		s.P50 = float64(p) / 1e6
	}
	if p, ok := bpf.Quantile(&d, 0.95); ok {
		s.P95 = float64(p) / 1e6
	}
	return s
}

// queueOver is the class's mean queue delay over buckets lo to hi (ms):
// its mean backlog over what it passed in them (Little's law), 0 where
// it passed nothing.
func (c *ClassSeries) queueOver(lo, hi int) float64 {
	var backlog, bps float64
	for i := max(lo, 0); i < hi && i < len(c.Backlog) && i < len(c.Bps); i++ {
		backlog += float64(c.Backlog[i])
		bps += c.Bps[i]
	}
	if bps <= 0 {
		return 0
	}
	return backlog * 8 / bps * 1e3
}
