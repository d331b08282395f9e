package policy

import (
	"testing"

	"sluice/units"
)

// ScaleRates moves every rate together and keeps every size written in
// bytes, a policer's buckets among them: TCP's bursts are packets, so a
// bucket scaled with its rate would pass less of the rate (conformance
// of examples/isp.yaml at a tenth read guests at a seventh of theirs).
func TestScaleRatesKeepsSizes(t *testing.T) {
	p, errs, err := Parse("p.yaml", []byte(`interfaces:
  - name: eth0
    egress:
      rate: 100mbit
      classes:
        - name: web
          rate: 40mbit
          ceil: 80mbit
          burst: 30kb
          match: [{dport: 80}]
        - name: guests
          rate: 20mbit
          match: [{dst: 10.9.0.0/24}]
          police: {cir: 10mbit, cbs: 20kb, pir: 20mbit, pbs: 40kb, red: drop}
        - name: other
          rate: 10mbit
      default: other
`))
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	tr := p.Interfaces[0].Egress
	web, guests := tr.Classes[0], tr.Classes[1]
	burst := *web.Burst
	pl := *guests.Police
	p.ScaleRates(0.1)
	for _, c := range []struct {
		name      string
		got, want units.Rate
	}{
		{"tree rate", tr.RateBps, units.FromBits(10e6)},
		{"web rate", web.RateBps, units.FromBits(4e6)},
		{"web ceil", web.CeilBps, units.FromBits(8e6)},
		{"guests cir", guests.Police.CIRBps, units.FromBits(1e6)},
		{"guests pir", guests.Police.PIRBps, units.FromBits(2e6)},
	} {
		if c.got != c.want {
			t.Errorf("%s at a tenth: %v, want %v", c.name, c.got, c.want)
		}
	}
	if *web.Burst != burst {
		t.Errorf("web's burst scaled: %+v, was %+v", *web.Burst, burst)
	}
	if g := guests.Police; g.CBSBytes != pl.CBSBytes || g.PBSBytes != pl.PBSBytes || g.EBSBytes != pl.EBSBytes || g.CBSBytes != 20<<10 || g.PBSBytes != 40<<10 {
		t.Errorf("guests' buckets at a tenth: cbs %d pbs %d ebs %d; want them kept (20kb and 40kb: 20,480 and 40,960 bytes)", g.CBSBytes, g.PBSBytes, g.EBSBytes)
	}
	if tr.Scale != 0.1 {
		t.Errorf("tree scale %v, want 0.1", tr.Scale)
	}
}
