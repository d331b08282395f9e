package tc

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Watcher keeps the kernel's notifications of tc and link changes in
// one namespace: qdiscs, classes, filters and actions added, changed or
// deleted, and links that come, go or change. Whoever reads a tree back
// takes the notifications first (Take); while none has come since,
// nothing the read saw can have changed, except what sends none (BPF
// maps, programs attached by link).
//
// The kernel queues a notification before it answers the write that
// caused it, so once a writer's request has returned, Take returns the
// notification of its own change: a writer can tell its changes from
// anyone else's. The notifications wait in the socket until taken; a
// full socket buffer loses some, which Take reports (lost).
type Watcher struct {
	sock *nl.NetlinkSocket
	buf  []byte
}

// Note is one notification: the message type (unix.RTM_NEWTCLASS, ...)
// and, for tc messages, the object's device, handle and parent.
type Note struct {
	Type    uint16
	Ifindex int32
	Handle  Handle
	Parent  Handle
}

// Watch subscribes to namespace name's tc and link notifications ("":
// the caller's namespace).
func Watch(name string) (*Watcher, error) {
	ns, err := nsByName(name)
	if err != nil {
		return nil, err
	}
	if ns.IsOpen() {
		defer ns.Close()
	}
	s, err := nl.SubscribeAt(ns, netns.None(), unix.NETLINK_ROUTE, unix.RTNLGRP_TC, unix.RTNLGRP_LINK)
	if err != nil {
		return nil, fmt.Errorf("subscribing to tc notifications: %w", err)
	}
	// A first apply of 10,000 hosts notifies 20,000 objects; what
	// overflows the buffer is only reported lost.
	s.SetReceiveBufferSize(4<<20, false)
	return &Watcher{sock: s}, nil
}

// maxNotes bounds what Take keeps: beyond it the caller reads every
// tree back anyway.
const maxNotes = 4096

// Take returns the notifications queued since the last Take. lost
// reports that some were dropped (the buffer filled, or there were more
// than it keeps): the caller must assume anything changed. An error
// means the watcher no longer works.
func (w *Watcher) Take() (notes []Note, lost bool, err error) {
	// recvfrom without waiting, not the library's Receive: its deadline
	// is checked before the first read, so a short one can report an
	// empty socket that holds a notification.
	if w.buf == nil {
		w.buf = make([]byte, 64<<10)
	}
	for {
		n, _, err := unix.Recvfrom(w.sock.GetFd(), w.buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN):
			return notes, lost, nil
		case errors.Is(err, unix.ENOBUFS):
			lost = true
			continue
		case errors.Is(err, unix.EINTR):
			continue
		default:
			return notes, true, err
		}
		msgs, err := syscall.ParseNetlinkMessage(w.buf[:n])
		if err != nil {
			lost = true
			continue
		}
		for _, m := range msgs {
			if len(notes) == maxNotes {
				lost = true
				break
			}
			notes = append(notes, note(m))
		}
	}
}

func note(m syscall.NetlinkMessage) Note {
	n := Note{Type: m.Header.Type}
	switch m.Header.Type {
	case unix.RTM_NEWQDISC, unix.RTM_DELQDISC, unix.RTM_NEWTCLASS, unix.RTM_DELTCLASS,
		unix.RTM_NEWTFILTER, unix.RTM_DELTFILTER:
		if len(m.Data) >= nl.SizeofTcMsg {
			tm := nl.DeserializeTcMsg(m.Data)
			n.Ifindex, n.Handle, n.Parent = tm.Ifindex, Handle(tm.Handle), Handle(tm.Parent)
		}
	}
	return n
}

// Close stops watching.
func (w *Watcher) Close() { w.sock.Close() }
