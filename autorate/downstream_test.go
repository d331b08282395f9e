package autorate

import (
	"math"
	"testing"
	"time"
)

// downlink is a download shaped on arrival, behind the link's buffer:
// the senders (bulk TCP, as a fluid window) feed the modem, whose buffer
// drains at its capacity into the shaper, whose own queue (a FIFO of
// 50 ms at its rate, sluice's bfifo leaf) drains at its rate. The
// senders' rate is their window over the round trip, which both queues
// lengthen; a drop at either buffer takes a quarter of the window's
// back-off (one of four flows halves, as CUBIC, to 0.7). A probe (a
// ping, in its own class) waits in the modem's queue only.
type downlink struct {
	capacity func(at time.Duration) float64 // bits per second
	path     time.Duration                  // round trip of empty queues
	buffer   time.Duration                  // the modem's, at its capacity

	cwnd     float64 // bits in flight the senders allow
	modem    float64 // bits queued in the modem
	shaper   float64 // bits queued in the shaper
	passed   uint64  // bytes through the shaper
	inFlight []Sample
	lastDrop time.Duration
}

// runDown drives c over l for d, as run does: a sample every 50 ms from
// three reflectors in turn, the counter every 100 ms, a decision after
// every sample.
func runDown(c *Controller, l *downlink, d time.Duration, tr *trace) {
	const dt = time.Millisecond
	const mss = 1500 * 8
	for at := time.Duration(0); at < d; at += dt {
		now := t0.Add(at)
		capacity, rate := l.capacity(at), c.Rate().BitsFloat()
		rtt := l.path.Seconds() + l.modem/capacity + l.shaper/math.Max(rate, 1)
		send := l.cwnd / rtt
		s := dt.Seconds()
		// The modem: in at what the senders send, out at its capacity.
		l.modem += send * s
		out := math.Min(l.modem, capacity*s)
		l.modem -= out
		drop := false
		if full := capacity * l.buffer.Seconds(); l.modem > full {
			l.modem, drop = full, true
		}
		// The shaper: in what the modem delivered, out at its rate.
		l.shaper += out
		through := math.Min(l.shaper, rate*s)
		l.shaper -= through
		if full := math.Max(rate*0.05, 2*mss); l.shaper > full {
			l.shaper, drop = full, true
		}
		l.passed += uint64(through / 8)
		// Four flows: each grows a segment a round trip; a loss (at most
		// one reaction a round trip) backs one of them off.
		l.cwnd += 4 * mss * s / rtt
		if drop && (at-l.lastDrop).Seconds() > rtt {
			l.cwnd *= 1 - 0.3/4
			l.lastDrop = at
		}
		i := int(at / dt)
		if i%100 == 0 {
			c.Passed(now, l.passed)
		}
		qdelay := time.Duration(l.modem / capacity * float64(time.Second))
		if i%50 == 0 {
			r := []string{"r1", "r2", "r3"}[(i/50)%3]
			delay := l.path/2 + qdelay
			l.inFlight = append(l.inFlight, Sample{Reflector: r, At: now.Add(delay), Delay: delay})
		}
		for len(l.inFlight) > 0 && !l.inFlight[0].At.After(now) {
			c.Delay(l.inFlight[0])
			l.inFlight = l.inFlight[1:]
		}
		if i%50 == 0 {
			c.Decide(now)
		}
		if i%10 == 0 && tr != nil {
			tr.at = append(tr.at, at)
			tr.rate = append(tr.rate, rate)
			tr.queue = append(tr.queue, qdelay)
			tr.goodput = append(tr.goodput, through/s)
			tr.cap = append(tr.cap, capacity)
		}
	}
}

// The lab's variable-rate download (100 -> 40 -> 80 -> 20 Mbit/s every
// 10 s, half a second of buffer, a 5 ms threshold) in the model: in each
// phase's steady part (from its third second) the link carries at least
// 85% of its capacity. After a drop the rate falls under the capacity
// and stays there while the modem's queue drains: it drains as fast as
// the senders back off, a round trip at a time (the queue is their
// windows, sized for the faster link), so a deeper cut drains no faster
// and only wastes the link. Before the rate held while the queue
// drained at the shaper's full rate, each decision on the draining
// queue cut it again, to the minimum: 0.735 and 0.675 of 40 and 20
// Mbit/s here, where it now carries 0.935 and 0.937. The modem's queue
// (what the ping waits) is logged: after the fall to 20 Mbit/s it holds
// 122 ms (p95) past the phase's second second in this model, whose
// senders back off one flow a round trip; the lab's, real TCP, 36 to
// 59 ms (docs/autorate.md).
func TestDownloadFollowsTheCapacity(t *testing.T) {
	c := newController(t, Config{Min: mbit(10), Base: mbit(50), Max: mbit(100), DelayThreshold: 5 * time.Millisecond, Downstream: true})
	capacities := []float64{100, 40, 80, 20}
	l := &downlink{capacity: steps(10*time.Second, capacities...), path: time.Millisecond, buffer: 500 * time.Millisecond, cwnd: 1500 * 8 * 4}
	var tr trace
	runDown(c, l, 40*time.Second, &tr)
	for i, capacity := range capacities {
		from := time.Duration(i)*10*time.Second + 2*time.Second
		p95, share, last := tr.span(from, from+8*time.Second)
		t.Logf("%3.0f Mbit/s: the modem's queue p95 %v, goodput %.3f of the capacity, rate at the end %.1f Mbit/s", capacity, p95.Round(time.Millisecond/10), share, last/1e6)
		if share < 0.85 {
			t.Errorf("at %.0f Mbit/s the link carried %.3f of its capacity; want at least 0.85", capacity, share)
		}
	}
}
