package plan

import "sort"

// Alloc remembers the ids a device's tree was given, so that a class
// keeps its class id, and a rule its filter prio, for as long as it keeps
// its name: re-planning an edited policy then changes only what the edit
// touched. The kernel layer stores it with the ownership record.
type Alloc struct {
	Classes map[string]uint16 `json:"classes"` // class name -> minor id
	Prios   map[string]uint16 `json:"prios"`   // block/rule -> filter prio
	Tables  map[string]uint16 `json:"tables"`  // u32 hash table key -> table id
	// Sharded trees only: a host class's shard, a leaf qdisc's major
	// (class minors repeat across shards, qdisc handles may not), and a
	// class's BPF counter.
	Shards   map[string]uint16 `json:"shards,omitempty"`
	Leaves   map[string]uint16 `json:"leaves,omitempty"`
	Counters map[string]uint32 `json:"counters,omitempty"`
	// EDT trees only: an aggregate's delay histogram, by class name.
	Hists map[string]uint16 `json:"hists,omitempty"`
	// Tag marks the tree's HTB qdiscs as the ones this record describes:
	// they carry it as r2q, which is inert because every class has an
	// explicit quantum. A root qdisc of the same handle made by anyone
	// else (tc's default r2q is 10) is then told apart with one get.
	// 0 plans DefaultR2Q; the kernel layer picks a tag for a new tree.
	Tag uint32 `json:"tag,omitempty"`
}

// DefaultR2Q is tc's r2q, planned for a tree without a tag.
const DefaultR2Q = 10

// R2Q is the r2q a tree with this allocation carries.
func (a *Alloc) R2Q() uint32 {
	if a != nil && a.Tag != 0 {
		return a.Tag
	}
	return DefaultR2Q
}

func newAlloc() *Alloc {
	return &Alloc{Classes: map[string]uint16{}, Prios: map[string]uint16{}, Tables: map[string]uint16{}}
}

// idPool hands out ids in [lo, hi]: a key keeps its previous id; a new
// key gets the lowest id no key had before (so that it cannot take an
// id a later key still owns), or, when those run out, any free id.
// Ids are never given back during a build, so a cursor per pass keeps
// handing out n ids linear in n. Ids taken and reserved are bit sets: a
// re-plan of 10,000 hosts spent a third of its time in maps of them.
type idPool[T uint16 | uint32] struct {
	prev           map[string]T
	next           map[string]T
	used, reserved bitset
	lo, hi         T
	cursor         [2]uint64
	// allowed, when set, says which ids in [lo, hi] may be handed out.
	allowed func(T) bool
	// prevOK, when set, says which keys of prev may have their id back.
	prevOK func(key string) bool
}

func newPool[T uint16 | uint32](prev map[string]T, lo, hi T) *idPool[T] {
	n := uint64(hi) + 1
	p := &idPool[T]{prev: prev, next: make(map[string]T, len(prev)), used: newBitset(n),
		reserved: newBitset(n), lo: lo, hi: hi, cursor: [2]uint64{uint64(lo), uint64(lo)}}
	for _, id := range prev {
		p.reserved.set(uint64(id))
	}
	return p
}

func (p *idPool[T]) get(key string) (T, bool) {
	if id, ok := p.next[key]; ok {
		return id, true
	}
	if id, ok := p.prev[key]; ok && id >= p.lo && id <= p.hi && !p.used.has(uint64(id)) && p.ok(id) &&
		(p.prevOK == nil || p.prevOK(key)) {
		return p.take(key, id), true
	}
	for pass, avoidReserved := range []bool{true, false} {
		for id := p.cursor[pass]; id <= uint64(p.hi); id++ {
			p.cursor[pass] = id
			if !p.used.has(id) && !(avoidReserved && p.reserved.has(id)) && p.ok(T(id)) {
				return p.take(key, T(id)), true
			}
		}
		p.cursor[pass] = uint64(p.hi) + 1
	}
	return 0, false
}

// getBytes is get for a key in a scratch buffer: only a key new to
// the pool is copied into a string.
func (p *idPool[T]) getBytes(key []byte) (T, bool) {
	if id, ok := p.next[string(key)]; ok {
		return id, true
	}
	return p.get(string(key))
}

func (p *idPool[T]) ok(id T) bool { return p.allowed == nil || p.allowed(id) }

func (p *idPool[T]) take(key string, id T) T {
	p.used.set(uint64(id))
	p.next[key] = id
	return id
}

// bitset is a set of small integers.
type bitset []uint64

func newBitset(n uint64) bitset { return make(bitset, (n+63)/64) }

func (b bitset) set(i uint64)      { b[i/64] |= 1 << (i % 64) }
func (b bitset) has(i uint64) bool { return b[i/64]&(1<<(i%64)) != 0 }

// orderedPrios gives each key of an ordered list a filter prio so that
// prios increase along the list, keeping as many previous prios as the
// order allows (those on a longest increasing run) and fitting new keys
// into the gaps. Only when a gap is too small is the whole list
// renumbered.
func orderedPrios(keys []string, prev map[string]uint16, lo, hi uint16) map[string]uint16 {
	const step = 16
	out := map[string]uint16{}
	if len(keys) == 0 {
		return out
	}
	// Longest strictly increasing subsequence of previous prios.
	type item struct {
		idx  int
		prio uint16
	}
	var have []item
	for i, k := range keys {
		if p, ok := prev[k]; ok && p >= lo && p <= hi {
			have = append(have, item{i, p})
		}
	}
	keep := lis(have, func(a, b item) bool { return a.prio < b.prio })
	kept := map[int]uint16{}
	for _, it := range keep {
		kept[it.idx] = it.prio
	}
	ok := true
	for i := 0; i < len(keys) && ok; {
		if p, isKept := kept[i]; isKept {
			out[keys[i]] = p
			i++
			continue
		}
		j := i // keys[i:j] are new, between kept neighbours
		for j < len(keys) {
			if _, isKept := kept[j]; isKept {
				break
			}
			j++
		}
		below := int(lo) - 1
		if i > 0 {
			below = int(out[keys[i-1]])
		}
		n := j - i
		for t := 0; t < n; t++ {
			var p int
			if j < len(keys) { // spread evenly below the next kept prio
				above := int(kept[j])
				if above-below <= n {
					ok = false
					break
				}
				p = below + (above-below)*(t+1)/(n+1)
			} else { // at the end: continue the regular spacing
				p = below + step*(t+1)
				if p > int(hi) {
					ok = false
					break
				}
			}
			out[keys[i+t]] = uint16(p)
		}
		i = j
	}
	if ok {
		return out
	}
	s := max(1, min(step, (int(hi)-int(lo)+1)/(len(keys)+1)))
	for i, k := range keys {
		out[k] = uint16(int(lo) - 1 + s*(i+1))
	}
	return out
}

// lis returns a longest strictly increasing subsequence of xs.
func lis[T any](xs []T, less func(a, b T) bool) []T {
	if len(xs) == 0 {
		return nil
	}
	tails := []int{}
	prev := make([]int, len(xs))
	for i := range xs {
		j := sort.Search(len(tails), func(k int) bool { return !less(xs[tails[k]], xs[i]) })
		if j > 0 {
			prev[i] = tails[j-1]
		} else {
			prev[i] = -1
		}
		if j == len(tails) {
			tails = append(tails, i)
		} else {
			tails[j] = i
		}
	}
	out := make([]T, len(tails))
	for k, i := len(tails)-1, tails[len(tails)-1]; k >= 0; k, i = k-1, prev[i] {
		out[k] = xs[i]
	}
	return out
}
