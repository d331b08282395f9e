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
// packets: how many, and their median and 95th percentile (ms).
type RTTStat struct {
	Samples uint64  `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P95     float64 `json:"p95_ms"`
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
	}
	s := &RTTStat{Samples: d.Count}
	if p, ok := bpf.Quantile(&d, 0.5); ok {
		s.P50 = float64(p) / 1e6
	}
	if p, ok := bpf.Quantile(&d, 0.95); ok {
		s.P95 = float64(p) / 1e6
	}
	return s
}
