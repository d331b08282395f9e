package kernel

import (
	"encoding/json"
	"math/bits"
	"unsafe"

	"sluice/bpf"
	"sluice/tc"
)

// A fingerprint condenses one planned object into 64 bits. The records
// keep the fingerprint of every object an apply left in the kernel, so
// that the next apply can tell which objects a policy edit touches
// without reading the whole tree back (see ReadTouched). Every field of
// the desired object goes in (the test checks this field by field): a
// fingerprint that misses a field would hide a change.
type fingerprint uint64

const fpPrime = 0x100000001b3

func (h *fingerprint) u64(v uint64) {
	x := uint64(*h) ^ v
	x *= fpPrime
	*h = fingerprint(bits.RotateLeft64(x, 29) ^ x>>17)
}

func (h *fingerprint) str(s string) {
	h.u64(uint64(len(s)))
	for len(s) >= 8 {
		h.u64(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
		s = s[8:]
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		v |= uint64(s[i]) << (8 * i)
	}
	h.u64(v)
}

func (h *fingerprint) flag(b bool) {
	if b {
		h.u64(1)
	} else {
		h.u64(0)
	}
}

// present hashes whether an optional part is there.
func present[T any](h *fingerprint, p *T) bool {
	h.flag(p != nil)
	return p != nil
}

// fingerprintOf fingerprints a desired object. Readback-only fields
// (counters, the kernel's tick values, indexes) are left out.
func fingerprintOf(o tc.Object) uint64 {
	h := fingerprint(0xcbf29ce484222325)
	if k := kindOf(o); k != nil {
		k.hash(&h, o)
	} else {
		h.str(o.Key())
		h.str(o.Describe())
	}
	return uint64(h)
}

// contentFingerprint covers a classifier's map content: the small parts
// through their JSON, the host table (up to 100,000 entries, in no
// order) as a sum of per-entry fingerprints of the raw map key and value.
func contentFingerprint(c *bpf.Content) uint64 {
	h := fingerprint(0x9e3779b97f4a7c15)
	h.u64(uint64(c.L2Len))
	h.flag(c.SetPriority)
	h.flag(c.TestClock)
	h.flag(c.Ingress)
	h.u64(uint64(c.Shards))
	h.u64(uint64(c.Default))
	parts := []any{c.Rules, c.Blocks, c.Targets, c.Policers, c.EDT}
	if c.RTT != nil {
		parts = append(parts, c.RTT)
	}
	for _, part := range parts {
		b, err := json.Marshal(part)
		if err != nil {
			panic(err) // plain structs of numbers
		}
		h.str(string(b))
	}
	var sum uint64
	for k, t := range c.Hosts {
		e := fingerprint(0)
		e.str(unsafe.String((*byte)(unsafe.Pointer(&k)), unsafe.Sizeof(k)))
		e.str(unsafe.String((*byte)(unsafe.Pointer(&t)), unsafe.Sizeof(t)))
		sum += uint64(e)
	}
	h.u64(sum)
	h.u64(uint64(len(c.Hosts)))
	return uint64(h)
}

// fingerprints maps each object's key to its fingerprint.
func fingerprints(objs []tc.Object) map[string]uint64 {
	keys, fps := keyedFingerprints(objs)
	out := make(map[string]uint64, len(objs))
	for i, key := range keys {
		out[key] = fps[i]
	}
	return out
}
