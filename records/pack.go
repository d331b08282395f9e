package records

import (
	"encoding/binary"
	"errors"
	"io"
	"unsafe"

	"sluice/tc"
	"sluice/units"
)

// The bulk of a tree's record (its id allocation, its classes and the
// fingerprints of its objects: with 10,000 hosts some 50,000 entries)
// is kept in a compact binary form inside the JSON, so that an apply
// reads and writes it in milliseconds. Layout, all integers uvarints,
// strings length-prefixed:
//
//	version(=1)
//	alloc: present, then six maps (classes prios tables shards leaves
//	       counters), each a count and (key, id) pairs
//	classes: count, then name handle parent rate ceil prio leaf
//	         default counter replica each
//	objects: count, then (key, fingerprint as 8 bytes) pairs
//
// Version 2 adds the alloc's tag (a uvarint) after its maps; version 3
// the EDT delay histograms: the alloc's hists map after the tag, and
// each class's hist after replica; version 4 each class's round-trip
// histogram after its hist.
const packVersion = 4

// packer appends to b and hands b to w whenever it passes 64 KB: the
// bulk streams to its file instead of taking megabytes of fresh memory.
type packer struct {
	b   []byte
	w   io.Writer
	n   int // bytes handed to w
	err error
}

func (p *packer) uv(v uint64) { p.b = binary.AppendUvarint(p.b, v) }
func (p *packer) str(s string) {
	p.uv(uint64(len(s)))
	p.b = append(p.b, s...)
}
func (p *packer) flag(v bool) {
	if v {
		p.uv(1)
	} else {
		p.uv(0)
	}
}

// spill writes out what is buffered once it is big enough (all of it
// when force).
func (p *packer) spill(force bool) {
	if len(p.b) < 64<<10 && !force {
		return
	}
	if p.err == nil {
		_, p.err = p.w.Write(p.b)
	}
	p.n += len(p.b)
	p.b = p.b[:0]
}

func packMap[T uint16 | uint32](p *packer, m map[string]T) {
	p.uv(uint64(len(m)))
	for k, v := range m {
		p.str(k)
		p.uv(uint64(v))
		p.spill(false)
	}
}

// pack writes a tree's packed bulk to w and returns its length.
func pack(w io.Writer, a *Alloc, classes []Class, objects map[string]uint64) (int, error) {
	p := &packer{b: make([]byte, 0, 80<<10), w: w}
	p.uv(packVersion)
	p.flag(a != nil)
	if a != nil {
		packMap(p, a.Classes)
		packMap(p, a.Prios)
		packMap(p, a.Tables)
		packMap(p, a.Shards)
		packMap(p, a.Leaves)
		packMap(p, a.Counters)
		p.uv(uint64(a.Tag))
		packMap(p, a.Hists)
	}
	p.uv(uint64(len(classes)))
	for _, c := range classes {
		p.str(c.Name)
		p.uv(uint64(c.Handle))
		p.uv(uint64(c.Parent))
		p.uv(uint64(c.Rate))
		p.uv(uint64(c.Ceil))
		p.uv(uint64(c.Prio))
		p.str(c.Leaf)
		p.flag(c.Default)
		p.uv(uint64(c.Counter))
		p.flag(c.Replica)
		p.uv(uint64(c.Hist))
		p.uv(uint64(c.RTT))
		p.spill(false)
	}
	p.uv(uint64(len(objects)))
	for k, fp := range objects {
		p.str(k)
		p.b = binary.LittleEndian.AppendUint64(p.b, fp)
		p.spill(false)
	}
	p.spill(true)
	return p.n, p.err
}

// unpacker reads what pack wrote. Strings are cut out of the buffer,
// not allocated one by one.
type unpacker struct {
	s   string
	off int
	err error
}

var errPacked = errors.New("packed record is truncated or corrupt")

func (u *unpacker) uv() uint64 {
	if u.err != nil {
		return 0
	}
	v, n := binary.Uvarint(unsafe.Slice(unsafe.StringData(u.s[u.off:]), len(u.s)-u.off))
	if n <= 0 {
		u.err = errPacked
		return 0
	}
	u.off += n
	return v
}

func (u *unpacker) str() string {
	n := u.uv()
	if u.err != nil || n > uint64(len(u.s)-u.off) {
		u.err = errPacked
		return ""
	}
	s := u.s[u.off : u.off+int(n)]
	u.off += int(n)
	return s
}

// count reads an element count, refusing one the rest of the buffer
// cannot hold (each element takes at least min bytes).
func (u *unpacker) count(min int) int {
	n := u.uv()
	if n > uint64((len(u.s)-u.off)/min) {
		u.err = errPacked
		return 0
	}
	return int(n)
}

func unpackMap[T uint16 | uint32](u *unpacker) map[string]T {
	n := u.count(2)
	m := make(map[string]T, n)
	for i := 0; i < n && u.err == nil; i++ {
		k := u.str()
		m[k] = T(u.uv())
	}
	return m
}

func unpack(b []byte) (a *Alloc, classes []Class, objects map[string]uint64, err error) {
	if len(b) == 0 {
		return nil, nil, nil, errPacked
	}
	// The strings point into b, which its reader (Load) read for
	// this alone and never changes: no copy of megabytes.
	u := &unpacker{s: unsafe.String(&b[0], len(b))}
	v := u.uv()
	if v < 1 || v > packVersion {
		return nil, nil, nil, errors.New("packed record of an unknown version")
	}
	if u.uv() == 1 {
		a = &Alloc{}
		a.Classes = unpackMap[uint16](u)
		a.Prios = unpackMap[uint16](u)
		a.Tables = unpackMap[uint16](u)
		a.Shards = unpackMap[uint16](u)
		a.Leaves = unpackMap[uint16](u)
		a.Counters = unpackMap[uint32](u)
		if v >= 2 {
			a.Tag = uint32(u.uv())
		}
		if v >= 3 {
			if a.Hists = unpackMap[uint16](u); len(a.Hists) == 0 {
				a.Hists = nil
			}
		}
		// As the JSON form had them: the sharded trees' maps absent
		// when empty.
		if len(a.Shards) == 0 && len(a.Leaves) == 0 && len(a.Counters) == 0 {
			a.Shards, a.Leaves, a.Counters = nil, nil, nil
		}
	}
	n := u.count(10)
	classes = make([]Class, 0, n)
	for i := 0; i < n && u.err == nil; i++ {
		c := Class{Name: u.str(), Handle: tc.Handle(u.uv()), Parent: tc.Handle(u.uv()),
			Rate: units.Rate(u.uv()), Ceil: units.Rate(u.uv()), Prio: uint32(u.uv()), Leaf: u.str()}
		c.Default = u.uv() == 1
		c.Counter = uint32(u.uv())
		c.Replica = u.uv() == 1
		if v >= 3 {
			c.Hist = uint16(u.uv())
		}
		if v >= 4 {
			c.RTT = uint32(u.uv())
		}
		classes = append(classes, c)
	}
	n = u.count(9)
	objects = make(map[string]uint64, n)
	for i := 0; i < n && u.err == nil; i++ {
		k := u.str()
		if len(u.s)-u.off < 8 {
			u.err = errPacked
			break
		}
		objects[k] = binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(u.s[u.off:]), 8))
		u.off += 8
	}
	if u.err == nil && u.off != len(u.s) {
		u.err = errPacked
	}
	if u.err != nil {
		return nil, nil, nil, u.err
	}
	return a, classes, objects, nil
}
