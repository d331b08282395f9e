package bpf

// Meter is a reference implementation of the two token-bucket meters,
// written from the RFC texts (RFC 2697 section 4 and RFC 2698 section 3)
// and kept apart from the C code: tests run both on the same packets and
// demand the same colour for each. Time is continuous: tokens accrue at
// the rate for the time elapsed since the last packet, which is the RFC's
// "CIR times per second" update taken to its limit. Token counts are
// bytes times 1e9 (the rate in bytes/s times elapsed ns), exactly as the
// program keeps them, so that both sides do the same integer arithmetic.
type Meter struct {
	P      Policer
	tc, te uint64 // srTCM: C and E buckets; trTCM: C and P buckets
	last   uint64
}

const scale = 1_000_000_000

// NewMeter returns a meter whose buckets start full ("initially full",
// both RFCs).
func NewMeter(p Policer) *Meter {
	return &Meter{P: p, tc: p.CBS * scale, te: p.EBS * scale}
}

// Colour meters a packet of size bytes arriving at time now (ns) with
// pre-colour pre (Green for colour-blind mode).
func (m *Meter) Colour(now uint64, size uint32, pre int) int {
	var dt uint64
	if now > m.last {
		dt = now - m.last
		m.last = now
	}
	b := uint64(size) * scale
	if m.P.Mode == SrTCM {
		// RFC 2697: "If Tc is less than CBS, Tc is incremented by one,
		// else if Te is less then EBS, Te is incremented by one, else
		// neither Tc nor Te is incremented."
		fill := saturatingMul(dt, m.P.CIR)
		toC := min(fill, m.P.CBS*scale-m.tc)
		m.tc += toC
		m.te = min(m.P.EBS*scale, m.te+min(fill-toC, m.P.EBS*scale))
		// Colour-blind: green if Tc-B >= 0, else yellow if Te-B >= 0,
		// else red. Colour-aware: a green packet may take C, a green or
		// yellow one E, a red one is red.
		switch {
		case pre == Green && m.tc >= b:
			m.tc -= b
			return Green
		case pre != Red && m.te >= b:
			m.te -= b
			return Yellow
		}
		return Red
	}
	// RFC 2698: "The token count Tp is incremented by one PIR times per
	// second up to PBS and the token count Tc is incremented by one CIR
	// times per second up to CBS."
	m.tc = min(m.P.CBS*scale, m.tc+min(saturatingMul(dt, m.P.CIR), m.P.CBS*scale))
	m.te = min(m.P.EBS*scale, m.te+min(saturatingMul(dt, m.P.PIR), m.P.EBS*scale))
	// "If Tp(t)-B < 0, the packet is red, else if Tc(t)-B < 0, the packet
	// is yellow and Tp is decremented by B, else the packet is green and
	// both Tp and Tc are decremented by B." Colour-aware: a red packet
	// stays red, a yellow one can at best be yellow.
	switch {
	case pre == Red || m.te < b:
		return Red
	case pre == Yellow || m.tc < b:
		m.te -= b
		return Yellow
	}
	m.te -= b
	m.tc -= b
	return Green
}

func saturatingMul(a, b uint64) uint64 {
	if a != 0 && b > ^uint64(0)/a {
		return ^uint64(0)
	}
	return a * b
}

// PreColour is the colour-aware meters' input colour for a DSCP (RFC
// 2597 drop precedence): AFx2 yellow, AFx3 red, everything else green.
func PreColour(dscp uint8) int {
	cls, drop := dscp>>3, dscp&7
	switch {
	case cls < 1 || cls > 4:
		return Green
	case drop == 4:
		return Yellow
	case drop == 6:
		return Red
	}
	return Green
}
