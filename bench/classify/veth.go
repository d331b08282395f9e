package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"sluice/bench/internal/benchrun"
	"sluice/lab"
	"sluice/testutil"
)

// vethResult is one packet-rate measurement: a raw socket sends small
// frames out of a veth as fast as one CPU can, through the tree sluice
// applied, and the time per packet is the whole transmit path (socket,
// classification, HTB enqueue and dequeue, veth). Setups differ only in
// how the packet is classified.
type vethResult struct {
	Hosts      int     `json:"hosts"`
	Setup      string  `json:"setup"` // none, htb, u32-script, u32, bpf, edt
	NsPerPkt   float64 `json:"ns_per_packet,omitempty"`
	Packets    int     `json:"packets"`
	Classified uint64  `json:"classified_packets,omitempty"` // counted in the destination host's class
	Note       string  `json:"note,omitempty"`
}

// rounds of count packets per setup; the fastest counts (the others
// met interference).
const rounds = 5

// vethPolicy is content()'s policy on device veth0 with the given
// classifier ("" for a plain rate limit: HTB with one class).
func vethPolicy(classifier string) string {
	if classifier == "" {
		return "interfaces:\n  - name: veth0\n    egress: {rate: 10gbit}\n"
	}
	// EDT: the same classes as aggregates (fq at the root, no leaves).
	how, leaf := "classifier: "+classifier, ", leaf: none"
	if classifier == "edt" {
		how, leaf = "backend: edt", ""
	}
	return fmt.Sprintf(`interfaces:
  - name: veth0
    egress:
      rate: 10gbit
      default: rest
      %s
      classes:
        - {name: ssh, rate: 10mbit, match: [{dport: 22}]}
        - {name: dns, rate: 10mbit, match: [{proto: udp, dport: 53}]}
        - {name: voip, rate: 10mbit, match: [{dscp: EF}]}
        - {name: subs, rate: 9gbit, per_host: {by: dst, hosts_file: hosts.csv%s}}
        - {name: rest, rate: 100mbit}
`, how, leaf)
}

// measureVeth applies each setup to a fresh veth and times count packets
// to the last of n hosts (best of five rounds).
func measureVeth(sluiceBin string, n, count int, setups []string, htbMax int) []vethResult {
	dir, err := os.MkdirTemp("", "sluice-bench-veth")
	if err != nil {
		benchrun.Fail(err)
	}
	defer os.RemoveAll(dir)
	var csv bytes.Buffer
	csv.WriteString("name,addresses,rate,ceil\n")
	for i := 0; i < n; i++ {
		// ceil 10gbit: nothing is shaped, the CPU is the limit.
		fmt.Fprintf(&csv, "h%d,%s,1mbit,10gbit\n", i, hostAddr(i))
	}
	os.WriteFile(filepath.Join(dir, "hosts.csv"), csv.Bytes(), 0o644)
	frame := (&testutil.Packet{Src: netip.MustParseAddr("192.0.2.1"), Dst: hostAddr(n - 1), Proto: 6, Sport: 443, Dport: 40000, Payload: 18}).Frame()

	var out []vethResult
	for _, setup := range setups {
		r := vethResult{Hosts: n, Setup: setup, Packets: count}
		if htbMax > 0 && n > htbMax && setup != "none" && setup != "edt" {
			continue // HTB classes for every host: minutes to build here
		}
		if setup == "u32-script" && n > 1000 {
			r.Packets = count * 1000 / n // a linear walk: fewer packets, same precision
		}
		ns := fmt.Sprintf("sluice-bench-veth-%d", os.Getpid())
		state := filepath.Join(dir, "state-"+setup)
		exec.Command("ip", "netns", "del", ns).Run()
		benchrun.Must("ip", "netns", "add", ns)
		benchrun.Must("ip", "-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
		benchrun.Must("ip", "-n", ns, "link", "set", "veth0", "up")
		benchrun.Must("ip", "-n", ns, "link", "set", "veth1", "up")
		sluice := func(args ...string) (string, error) {
			cmd := exec.Command(sluiceBin, append([]string{"--netns", ns}, args...)...)
			cmd.Env = append(os.Environ(), "SLUICE_STATE_DIR="+state)
			var o bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &o
			err := cmd.Run()
			return o.String(), err
		}
		applied := true
		if setup == "u32-script" {
			// What a hand-written script does: a class and one u32
			// filter per host, all at one priority, walked in order.
			script := filepath.Join(dir, "script.tc")
			os.WriteFile(script, []byte(linearScript(n)), 0o644)
			if o, err := exec.Command("ip", "netns", "exec", ns, "tc", "-batch", script).CombinedOutput(); err != nil {
				benchrun.Fail(fmt.Errorf("tc -batch: %v: %s", err, o))
			}
		} else if setup != "none" {
			cls := map[string]string{"htb": "", "u32": "u32", "bpf": "bpf", "edt": "edt"}[setup]
			pol := filepath.Join(dir, "p-"+setup+".yaml")
			os.WriteFile(pol, []byte(vethPolicy(cls)), 0o644)
			if o, err := sluice("apply", "-q", pol); err != nil {
				r.Note = "not applied: " + benchrun.FirstLine(o)
				applied = false
			}
		}
		if applied {
			var per []float64
			for k := 0; k < rounds; k++ {
				d, err := blast(ns, "veth0", frame, r.Packets)
				if err != nil {
					benchrun.Fail(err)
				}
				per = append(per, float64(d.Nanoseconds())/float64(r.Packets))
			}
			sort.Float64s(per)
			r.NsPerPkt = per[0]
			switch setup {
			case "u32-script":
				r.Classified = tcClassPackets(ns, fmt.Sprintf("1:%x", 0x10+n-1))
			case "u32", "bpf", "edt":
				r.Classified = hostClassPackets(sluice, fmt.Sprintf("h%d", n-1))
			}
			if setup != "none" && setup != "htb" && r.Classified < uint64(rounds*r.Packets) {
				benchrun.Fail(fmt.Errorf("%s, %d hosts: the last host's class counted %d of %d packets", setup, n, r.Classified, rounds*r.Packets))
			}
		}
		exec.Command("ip", "netns", "del", ns).Run()
		fmt.Printf("%7d hosts  veth %-4s %7.1f ns/packet %s\n", n, setup, r.NsPerPkt, r.Note)
		out = append(out, r)
	}
	return out
}

// blast sends count copies of frame out of dev from inside ns through
// a raw packet socket (the qdisc path, as a forwarded packet takes).
func blast(ns, dev string, frame []byte, count int) (time.Duration, error) {
	var d time.Duration
	err := lab.InNetns(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], frame[:6])
		t0 := time.Now()
		for i := 0; i < count; i++ {
			// ENOBUFS is a drop at the qdisc, which an unshaped tree
			// should not have; count it as sent and let the class
			// counter check catch a tree that drops.
			if err := unix.Sendto(fd, frame, 0, to); err != nil && err != unix.ENOBUFS {
				return err
			}
		}
		d = time.Since(t0)
		return nil
	})
	return d, err
}

// linearScript is the classic tc script for n hosts: HTB, a class and
// a u32 filter per host, the filters in one list.
func linearScript(n int) string {
	var b bytes.Buffer
	b.WriteString("qdisc add dev veth0 root handle 1: htb default 2\n")
	b.WriteString("class add dev veth0 parent 1: classid 1:1 htb rate 10gbit\n")
	b.WriteString("class add dev veth0 parent 1:1 classid 1:2 htb rate 100mbit ceil 10gbit\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "class add dev veth0 parent 1:1 classid 1:%x htb rate 1mbit ceil 10gbit\n", 0x10+i)
	}
	for _, r := range []string{"match ip dport 22 0xffff", "match ip protocol 17 0xff match ip dport 53 0xffff", "match ip dsfield 0xb8 0xfc"} {
		fmt.Fprintf(&b, "filter add dev veth0 parent 1: protocol ip prio 1 u32 %s flowid 1:2\n", r)
	}
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "filter add dev veth0 parent 1: protocol ip prio 1 u32 match ip dst %s/32 flowid 1:%x\n", hostAddr(i), 0x10+i)
	}
	return b.String()
}

// tcClassPackets reads a class's sent packets from tc.
func tcClassPackets(ns, classid string) uint64 {
	o, _ := exec.Command("ip", "netns", "exec", ns, "tc", "-s", "class", "show", "dev", "veth0", "classid", classid).Output()
	var n, pkts uint64
	if i := bytes.Index(o, []byte("Sent ")); i >= 0 {
		fmt.Sscanf(string(o[i:]), "Sent %d bytes %d pkt", &n, &pkts)
	}
	return pkts
}

// hostClassPackets reads a host class's sent packets from `sluice show
// --json`.
func hostClassPackets(sluice func(...string) (string, error), name string) uint64 {
	o, err := sluice("show", "--json")
	if err != nil {
		benchrun.Fail(fmt.Errorf("sluice show: %v: %s", err, o))
	}
	var s struct {
		Trees []struct {
			Classes []struct {
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
			} `json:"classes"`
		} `json:"trees"`
	}
	if err := json.Unmarshal([]byte(o), &s); err != nil {
		benchrun.Fail(fmt.Errorf("sluice show --json: %v", err))
	}
	for _, t := range s.Trees {
		for _, c := range t.Classes {
			if c.Name == name || c.Name == "subs/"+name {
				return c.Packets
			}
		}
	}
	return 0
}
