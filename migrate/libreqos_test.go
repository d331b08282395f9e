package migrate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func hostByName(t *testing.T, d *Draft, file, name string) Host {
	t.Helper()
	for _, h := range d.Hosts[file] {
		if h.Name == name {
			return h
		}
	}
	t.Fatalf("no host %s in %s", name, file)
	return Host{}
}

func TestLibreQoSISP(t *testing.T) {
	d, err := LibreQoS("testdata/libreqos/isp", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	golden(t, d, "libreqos-isp")
	// Download leaves toward the subscribers (to_network), by
	// destination; upload toward the Internet, by source.
	down, up := d.Interfaces[0], d.Interfaces[1]
	if down.Name != "lan0" || up.Name != "wan0" || down.Egress.Rate != "1gbit" || up.Egress.Rate != "400mbit" {
		t.Fatalf("interfaces %s (%s) and %s (%s), want lan0 1gbit and wan0 400mbit", down.Name, down.Egress.Rate, up.Name, up.Egress.Rate)
	}
	if ph := class(t, d, "lan0/egress/circuits").PerHost; ph.By != "dst" || ph.HostsFile != libreqosHostsDown || *ph.Prio != 3 {
		t.Errorf("download per_host %+v", ph)
	}
	if ph := class(t, d, "wan0/egress/circuits").PerHost; ph.By != "src" || ph.HostsFile != libreqosHostsUp {
		t.Errorf("upload per_host %+v", ph)
	}
	// Nodes: ceil the maximum capped by the parent's, rate 95% of it
	// (scaled where siblings overbook); 0 takes the parent's.
	if c := class(t, d, "lan0/egress/Riverside"); c.Ceil != "250mbit" {
		t.Errorf("Riverside ceil %s, want 250mbit", c.Ceil)
	}
	if c := class(t, d, "wan0/egress/Hilltop-AP-South"); c.Ceil != "200mbit" {
		t.Errorf("AP South upload ceil %s, want its parent's 200mbit (its own is 0)", c.Ceil)
	}
	if c := class(t, d, "lan0/egress/default"); c.Ceil != "999mbit" || *c.Prio != 5 {
		t.Errorf("default class %+v, want ceil 999mbit prio 5", c)
	}
	// A circuit's devices are one host; its maximum is capped by its
	// node's; a circuit on a node with child nodes hangs below the
	// node's circuits class.
	oak := hostByName(t, d, libreqosHostsDown, "1001")
	if strings.Join(oak.Addresses, " ") != "100.64.1.10 100.64.1.11 2001:db8:1:100::/56 100.64.1.12" || oak.Rate != "10mbit" || oak.Ceil != "100mbit" || oak.Parent != "Hilltop-AP-North" {
		t.Errorf("circuit 1001: %+v", oak)
	}
	if h := hostByName(t, d, libreqosHostsUp, "1001"); h.Rate != "2mbit" || h.Ceil != "20mbit" {
		t.Errorf("circuit 1001 upload: %+v", h)
	}
	if h := hostByName(t, d, libreqosHostsDown, "1002"); h.Rate != "25500kbit" || h.Ceil != "400mbit" || h.Parent != "Hilltop-AP-South" {
		t.Errorf("circuit 1002: %+v", h)
	}
	if h := hostByName(t, d, libreqosHostsDown, "1003"); h.Parent != "Hilltop-circuits" {
		t.Errorf("circuit 1003 on a node with child nodes: parent %q", h.Parent)
	}
	if h := hostByName(t, d, libreqosHostsDown, "1006"); h.Parent != "" {
		t.Errorf("circuit 1006 without a node: parent %q, want the per_host class", h.Parent)
	}
	if n := len(d.Hosts[libreqosHostsDown]); n != 5 {
		t.Errorf("%d hosts, want 5 (1005's node is unknown, 1007's one address is 1004's)", n)
	}
	wantFinding(t, d, Approximated, `ShapedDevices.csv:5$`, `15 fields where the header names 14.*"Plan A, business"`)
	wantFinding(t, d, Approximated, `ShapedDevices.csv:10$`, `100.64.4.7.*ShapedDevices.csv:7`)
	wantFinding(t, d, Approximated, `ShapedDevices.csv:5$`, `circuit 1002.*above its node's 400`)
	wantFinding(t, d, Approximated, `ShapedDevices.csv:6$`, `sqm fq_codel.*not carried`)
	wantFinding(t, d, Approximated, `network.json:2$`, `node Hilltop: it has child nodes and 1 circuit`)
	wantFinding(t, d, Approximated, `lqos.conf$`, `CPU queues`)
	wantFinding(t, d, Approximated, `lqos.conf$`, `diffserv4 is left out`)
	wantFinding(t, d, Exact, `ShapedDevices.csv:8$`, `"Old Tower" is not in network.json`)

	// It writes the policy and both hosts files, and they load.
	out := t.TempDir()
	if _, err := d.Write(out, false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, libreqosHostsDown))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "# testdata/libreqos/isp/ShapedDevices.csv:3: circuit 12 Oak Lane, Millbrook\n1001,") {
		t.Errorf("hosts file does not name each circuit's row:\n%s", b)
	}
}

// ispConfig.py (LibreQoS before 1.4) names the same settings.
func TestLibreQoSIspConfigPy(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"ShapedDevices.csv", "network.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/libreqos/isp", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "ispConfig.py"), []byte("# settings\nsqm = 'fq_codel'\nupstreamBandwidthCapacityDownloadMbps = 1000\nupstreamBandwidthCapacityUploadMbps = 400  # ISP\ninterfaceA = 'eth1'\ninterfaceB = 'eth2'\nOnAStick = False\n"), 0o644)
	d, err := LibreQoS(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatal(err)
	}
	if d.Interfaces[0].Name != "eth1" || d.Interfaces[1].Name != "eth2" || d.Interfaces[0].Egress.Leaf != "fq_codel" || d.Interfaces[1].Egress.Rate != "400mbit" {
		t.Errorf("ispConfig.py: %s %s leaf %s, upload %s", d.Interfaces[0].Name, d.Interfaces[1].Name, d.Interfaces[0].Egress.Leaf, d.Interfaces[1].Egress.Rate)
	}
	if err := d.Check(); err != nil {
		t.Error(err)
	}
}

// A flat network: no network.json, or {}; the snake_case header of
// LibreQoS's docker example.
func TestLibreQoSFlat(t *testing.T) {
	for _, netjson := range []string{"", "{}\n"} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "lqos.conf"), []byte("[bridge]\nto_internet = \"eth0\"\nto_network = \"eth1\"\n[queues]\ndownlink_bandwidth_mbps = 100\nuplink_bandwidth_mbps = 20\ndefault_sqm = \"fq_codel\"\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "ShapedDevices.csv"), []byte("circuit_id,circuit_name,device_id,device_name,parent_node,mac,ipv4,ipv6,download_min,upload_min,download_max,upload_max,comment\n"+
			"a,A,1,a,Tower,,10.1.0.1,,5,1,50,10,\nb,B,2,b,,,10.1.0.2,,5,1,50,10,\n"), 0o644)
		if netjson != "" {
			os.WriteFile(filepath.Join(dir, "network.json"), []byte(netjson), 0o644)
		}
		d, err := LibreQoS(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Report.Refusals(); err != nil {
			t.Fatal(err)
		}
		if n := len(d.Hosts[libreqosHostsDown]); n != 2 {
			t.Fatalf("network.json %q: %d hosts, want 2", netjson, n)
		}
		for _, h := range d.Hosts[libreqosHostsDown] {
			if h.Parent != "" {
				t.Errorf("flat network: host %s below %q", h.Name, h.Parent)
			}
		}
		if c := class(t, d, "eth1/egress/circuits"); c.Rate != "10mbit" || c.Ceil != "100mbit" {
			t.Errorf("flat circuits class rate %s ceil %s, want the sum of minimums and the link", c.Rate, c.Ceil)
		}
		wantFinding(t, d, Exact, `ShapedDevices.csv:2$`, `flat network`)
	}
}

// What cannot be imported is refused at its line, with the reason.
func TestLibreQoSRefusals(t *testing.T) {
	conf := "[bridge]\nto_internet = \"eth0\"\nto_network = \"eth1\"\n[queues]\ndownlink_bandwidth_mbps = 100\nuplink_bandwidth_mbps = 20\n"
	header := "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n"
	for _, c := range []struct {
		name, conf, devices, network string
		at, want                     string
	}{
		{"short row", conf, header + "1,a,1,a,,,10.0.0.1,,5,1\n", "", `ShapedDevices.csv:2$`, `10 fields where the header .* names 13`},
		{"no header", conf, "1,a,1,a,,,10.0.0.1,,5,1,50,10,\n", "", `ShapedDevices.csv:1$`, `no circuit column`},
		{"min above max", conf, header + "1,a,1,a,,,10.0.0.1,,60,1,50,10,\n", "", `ShapedDevices.csv:2$`, `minimum above its maximum`},
		{"bad rate", conf, header + "1,a,1,a,,,10.0.0.1,,fast,1,50,10,\n", "", `ShapedDevices.csv:2$`, `Download Min Mbps: "fast"`},
		{"bad address", conf, header + "1,a,1,a,,,10.0.0.300,,5,1,50,10,\n", "", `ShapedDevices.csv:2$`, `"10.0.0.300" is not an address`},
		{"v6 in v4", conf, header + "1,a,1,a,,,2001:db8::1,,5,1,50,10,\n", "", `ShapedDevices.csv:2$`, `in the IPv4 column`},
		{"host bits", conf, header + "1,a,1,a,,,10.0.0.1/24,,5,1,50,10,\n", "", `ShapedDevices.csv:2$`, `host bits set`},
		{"parents differ", conf, header + "1,a,1,a,T,,10.0.0.1,,5,1,50,10,\n1,a,2,b,U,,10.0.0.2,,5,1,50,10,\n", `{"T":{"downloadBandwidthMbps":50,"uploadBandwidthMbps":10},"U":{"downloadBandwidthMbps":50,"uploadBandwidthMbps":10}}`, `ShapedDevices.csv:3$`, `different parent nodes`},
		{"node twice", conf, header + "1,a,1,a,,,10.0.0.1,,5,1,50,10,\n", "{\n\"T\": {\"downloadBandwidthMbps\": 50, \"uploadBandwidthMbps\": 10, \"children\": {\n\"T\": {\"downloadBandwidthMbps\": 5, \"uploadBandwidthMbps\": 1}}}}\n", `network.json:3$`, `name is used at .*network.json:2`},
		{"bad json", conf, header, "{\"T\": {\"downloadBandwidthMbps\": 50,\n}}\n", `network.json:2$`, `network.json`},
		{"bad node rate", conf, header, "{\"T\": {\"downloadBandwidthMbps\": \"lots\"}}\n", `network.json`, `want a number`},
		{"on a stick", "[single_interface]\ninterface = \"eth0\"\n[queues]\ndownlink_bandwidth_mbps = 100\nuplink_bandwidth_mbps = 20\n", header + "1,a,1,a,,,10.0.0.1,,5,1,50,10,\n", "", `lqos.conf$`, `VLAN`},
		{"no capacity", "[bridge]\nto_internet = \"eth0\"\nto_network = \"eth1\"\n", header + "1,a,1,a,,,10.0.0.1,,5,1,50,10,\n", "", `lqos.conf$`, `downlink bandwidth`},
		{"monitor only", conf + "monitor_only = true\n", header + "1,a,1,a,,,10.0.0.1,,5,1,50,10,\n", "", `lqos.conf$`, `monitor mode`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "lqos.conf"), []byte(c.conf), 0o644)
			os.WriteFile(filepath.Join(dir, "ShapedDevices.csv"), []byte(c.devices), 0o644)
			if c.network != "" {
				os.WriteFile(filepath.Join(dir, "network.json"), []byte(c.network), 0o644)
			}
			d, err := LibreQoS(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			wantFinding(t, d, Refused, c.at, c.want)
			if _, err := d.Write(t.TempDir(), false); err == nil {
				t.Error("a refused import was written")
			}
		})
	}
	if _, err := LibreQoS(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("no settings: %v", err)
	}
}

func FuzzLibreQoS(f *testing.F) {
	f.Add("Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n1,a,1,a,T,,10.0.0.1,,5,1,50,10,\n",
		`{"T":{"downloadBandwidthMbps":50,"uploadBandwidthMbps":10,"children":{"U":{"downloadBandwidthMbps":20}}}}`)
	f.Add("circuit_id,circuit_name,device_id,device_name,parent_node,mac,ipv4,ipv6,download_min,upload_min,download_max,upload_max,comment,sqm\n1,,1,a,,,\"10.0.0.0/30, 10.0.1.1\",2001:db8::/64,0.5,0.1,2.5,1,x, y,cake\n", "{}")
	f.Add("Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n1,a,1,a,U,,10.0.0.1,,5,1,50,10,\n",
		"Site Name,Download Mbps,Upload Mbps,Parent Site Name\nU,20,5,T\nT,50,10,\n")
	f.Fuzz(func(t *testing.T, devices, network string) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "lqos.conf"), []byte("[bridge]\nto_internet = \"eth0\"\nto_network = \"eth1\"\n[queues]\ndownlink_bandwidth_mbps = 100\nuplink_bandwidth_mbps = 20\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "ShapedDevices.csv"), []byte(devices), 0o644)
		// The node tree as network.json, or as manualNetwork.csv where
		// it is not JSON's object.
		netFile := "network.json"
		if !strings.HasPrefix(strings.TrimSpace(network), "{") {
			netFile = "manualNetwork.csv"
		}
		os.WriteFile(filepath.Join(dir, netFile), []byte(network), 0o644)
		d, err := LibreQoS(dir, "")
		if err != nil || d.Report.Refusals() != nil {
			return
		}
		if err := d.Check(); err != nil {
			t.Fatalf("an import without refusals does not validate: %v\n%s", err, d.Render())
		}
	})
}

// manualNetwork.csv, LibreQoS's other form of the node tree, is read
// where the directory has no network.json (as csvToNetworkJSON.py would
// write it), and said to be left where it has one; its mistakes are
// refused at their lines.
func TestLibreQoSManualNetwork(t *testing.T) {
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		files["lqos.conf"] = "[bridge]\nto_internet = \"eth0\"\nto_network = \"eth1\"\n[queues]\ndownlink_bandwidth_mbps = 1000\nuplink_bandwidth_mbps = 1000\ndefault_sqm = \"fq_codel\"\n"
		if _, ok := files["ShapedDevices.csv"]; !ok {
			files["ShapedDevices.csv"] = "Circuit ID,Circuit Name,Device ID,Device Name,Parent Node,MAC,IPv4,IPv6,Download Min Mbps,Upload Min Mbps,Download Max Mbps,Upload Max Mbps,Comment\n1,one,1,d1,SiteC,,100.64.0.1,,1,1,50,10,\n"
		}
		for n, b := range files {
			if err := os.WriteFile(filepath.Join(dir, n), []byte(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	// Children before their parents, as a user may sort them.
	csv := "Site Name,Download Mbps,Upload Mbps,Parent Site Name\nSiteC,950,900,SiteB\nSiteA,1000,1000,\nSiteB,975,975,SiteA\n"
	d, err := LibreQoS(write(t, map[string]string{"manualNetwork.csv": csv}), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Report.Refusals(); err != nil {
		t.Fatalf("%v\n%s", err, d.Report)
	}
	out := string(d.Render())
	// SiteA > SiteB > SiteC, the circuit below SiteC.
	a, b, c := strings.Index(out, "name: SiteA"), strings.Index(out, "name: SiteB"), strings.Index(out, "name: SiteC")
	if a < 0 || b < a || c < b || !strings.Contains(out, "ceil: 950mbit") || !strings.Contains(out, "ceil: 900mbit") {
		t.Errorf("the tree from manualNetwork.csv:\n%s", out)
	}
	if !strings.Contains(d.Report.String(), "3 site(s) read as csvToNetworkJSON.py") {
		t.Errorf("the report does not say the CSV was read:\n%s", d.Report)
	}

	// Beside network.json: LibreQoS shapes by the JSON.
	d, err = LibreQoS(write(t, map[string]string{"manualNetwork.csv": csv, "network.json": `{"SiteC": {"downloadBandwidthMbps": 100, "uploadBandwidthMbps": 100}}`}), "")
	if err != nil {
		t.Fatal(err)
	}
	if out := string(d.Render()); strings.Contains(out, "SiteA") || !strings.Contains(d.Report.String(), "not read: LibreQoS shapes by network.json") {
		t.Errorf("beside network.json the CSV was read, or not said to be left:\n%s\n%s", out, d.Report)
	}

	for _, c := range []struct{ csv, at, why string }{
		{"Site Name,Download Mbps,Upload Mbps\nA,1,1\n", ":1$", `no "parent site name" column`},
		{"Site Name,Download Mbps,Upload Mbps,Parent Site Name\nSiteC,10,10,Nowhere\n", ":2$", `parent site "Nowhere": no row names it`},
		{"Site Name,Download Mbps,Upload Mbps,Parent Site Name\nSiteC,10,10,\nSiteC,5,5,\n", ":3$", `named twice \(first at line 2\)`},
		{"Site Name,Download Mbps,Upload Mbps,Parent Site Name\nSiteC,ten,10,\n", ":2$", `Download Mbps "ten"`},
		{"Site Name,Download Mbps,Upload Mbps,Parent Site Name\nSiteC,10,10,X\nX,10,10,SiteC\n", ":2$", `cycle`},
	} {
		d, err := LibreQoS(write(t, map[string]string{"manualNetwork.csv": c.csv}), "")
		if err != nil {
			t.Fatal(err)
		}
		wantFinding(t, d, Refused, c.at, c.why)
	}
}
