package tc

import (
	"bytes"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"

	"golang.org/x/sys/unix"
)

// The attribute walkers find what the library's parser finds in
// well-formed lists, and neither panics on truncated or corrupt ones
// (the library's does).
func TestAttrTableMatchesParseAttrs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		var b []byte
		for n := r.IntN(8); n > 0; n-- {
			v := make([]byte, r.IntN(13))
			for j := range v {
				v[j] = byte(r.Uint32())
			}
			typ := uint16(r.IntN(20))
			if r.IntN(4) == 0 {
				typ |= unix.NLA_F_NESTED
			}
			l := unix.SizeofRtAttr + len(v)
			b = native.AppendUint16(b, uint16(l))
			b = native.AppendUint16(b, typ)
			b = append(b, v...)
			for len(b)%unix.RTA_ALIGNTO != 0 {
				b = append(b, 0)
			}
		}
		if len(b) > 0 {
			lib, err := nl.ParseRouteAttr(b)
			if err != nil {
				t.Fatal(err)
			}
			m := parseAttrs(b)
			for _, a := range lib {
				if !bytes.Equal(m[a.Attr.Type&^unix.NLA_F_NESTED], a.Value) && !dup(lib, a) {
					t.Fatalf("case %d: type %d = %x, the library's %x", i, a.Attr.Type, m[a.Attr.Type], a.Value)
				}
			}
		}
		switch r.IntN(4) {
		case 0: // truncated
			b = b[:r.IntN(len(b)+1)]
		case 1: // a length that lies
			if len(b) >= 2 {
				native.PutUint16(b, uint16(r.IntN(300)))
			}
		}
		want := parseAttrs(b)
		var got [16][]byte
		attrTable(b, got[:])
		for typ := range got {
			w := want[uint16(typ)]
			if !bytes.Equal(got[typ], w) {
				t.Fatalf("case %d: type %d = %x, parseAttrs %x (in %x)", i, typ, got[typ], w, b)
			}
		}
	}
}

// dup reports whether a's type comes again later in attrs (the last
// one wins).
func dup(attrs []syscall.NetlinkRouteAttr, a syscall.NetlinkRouteAttr) bool {
	n := 0
	for _, x := range attrs {
		if x.Attr.Type&^unix.NLA_F_NESTED == a.Attr.Type&^unix.NLA_F_NESTED {
			n++
		}
	}
	return n > 1
}
