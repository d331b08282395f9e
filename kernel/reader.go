package kernel

import (
	"sluice/bpf"
	"sluice/records"
	"sluice/tc"
)

// Reader is a namespace seen read-only: its qdiscs, classes, devices'
// counters, sluice's records and classifiers (as bpf.View), and no
// method that changes any of them. Every change goes through the
// executor (Execute, journalled); what only reads (stats, the agent's
// controllers between passes, show) is handed a Reader, so that a write
// there does not compile. TestReaderCannotWrite keeps its methods to
// reads.
type Reader struct{ k *Kernel }

// Reader returns k seen read-only. Closing the reader closes k.
func (k *Kernel) Reader() *Reader { return &Reader{k} }

// OpenReader connects to namespace ns (the current one for "") to read
// it, without its records or lock (OpenBare).
func OpenReader(ns string) (*Reader, error) {
	k, err := OpenBare(ns)
	if err != nil {
		return nil, err
	}
	return k.Reader(), nil
}

// Close releases the connection (and k's lock, where it holds one).
func (r *Reader) Close() { r.k.Close() }

// Qdiscs reads dev's qdiscs.
func (r *Reader) Qdiscs(dev string) ([]*tc.Qdisc, error) { return r.k.Qdiscs(dev) }

// Classes reads the classes of dev's qdisc.
func (r *Reader) Classes(dev string, qdisc tc.Handle) ([]*tc.Class, error) {
	return r.k.Classes(dev, qdisc)
}

// ClassesOf reads the classes of several of dev's qdiscs.
func (r *Reader) ClassesOf(dev string, qdiscs []tc.Handle) ([]*tc.Class, error) {
	return r.k.ClassesOf(dev, qdiscs)
}

// TxBytes is dev's transmitted bytes counter.
func (r *Reader) TxBytes(dev string) (uint64, error) { return r.k.TxBytes(dev) }

// LinkBytes are dev's transmitted and received bytes counters.
func (r *Reader) LinkBytes(dev string) (tx, rx uint64, err error) { return r.k.LinkBytes(dev) }

// Snapshot reads everything on dev: its qdiscs, classes and filters,
// whoever made them (sluice import tc).
func (r *Reader) Snapshot(dev string) (*tc.Snapshot, error) { return r.k.conn.Snapshot(dev) }

// IngressRedirect names the device s's ingress filters redirect to ("":
// none).
func (r *Reader) IngressRedirect(s *tc.Snapshot) string { return r.k.conn.IngressRedirect(s) }

// LinkExists says whether device name exists.
func (r *Reader) LinkExists(name string) bool { return r.k.LinkExists(name) }

// IfIndex is device name's index.
func (r *Reader) IfIndex(name string) (int, error) { return r.k.IfIndex(name) }

// Recorded is what sluice's records say of device dev's tree (nil:
// nothing), as loaded (OpenReader's hold nothing). The records are
// read here, never saved: their journal is the executor's.
func (r *Reader) Recorded(dev string) *records.Tree { return r.k.Records().Devices[dev] }

// RecordedNames are the devices the records hold trees of, sorted.
func (r *Reader) RecordedNames() []string { return r.k.Records().Names() }

// Interrupted reports whether the records hold the journal of a change
// that did not finish.
func (r *Reader) Interrupted() bool { return r.k.Records().Interrupted() }

// OpenHook opens sluice's classifier on dev's hook read-only, or returns
// nil if there is none.
func (r *Reader) OpenHook(dev string, ingress bool) (*bpf.View, error) {
	p, err := r.k.openHook(dev, ingress)
	if p == nil || err != nil {
		return nil, err
	}
	return p.View(), nil
}
