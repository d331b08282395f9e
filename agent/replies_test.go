package agent

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// /api/v1/hosts replies are worked out once per query and reading, by
// one request at a time, and held up to a bound: a flood of queries
// takes one CPU at most and holds bounded memory (issue 58).
func TestHostRepliesAreSharedAndSerial(t *testing.T) {
	var r replies
	var calls, running, most atomic.Int32
	work := func(v string) func() any {
		return func() any {
			calls.Add(1)
			n := running.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			running.Add(-1)
			return v
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := fmt.Sprint(i % 4)
			if got := string(r.hosts(key, 1, work(key))); got != fmt.Sprintf("%q\n", key) {
				t.Errorf("reply %q for %s", got, key)
			}
		}(i)
	}
	wg.Wait()
	if calls.Load() != 4 || most.Load() != 1 {
		t.Errorf("%d encodings for 4 queries (want 4), %d at once (want 1)", calls.Load(), most.Load())
	}
	r.hosts("0", 2, work("0")) // a new reading: worked out again
	if calls.Load() != 5 {
		t.Errorf("a new reading reused the old reply")
	}
	for i := 0; i < 3*maxHostReplies; i++ {
		r.hosts(fmt.Sprint("q", i), 2, work("x"))
	}
	if n := len(r.hostBody); n > maxHostReplies {
		t.Errorf("%d replies held, bound %d", n, maxHostReplies)
	}
}
