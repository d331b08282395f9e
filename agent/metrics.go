package agent

import (
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"sluice/bpf"
	"sluice/stats"
	"sluice/version"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics holds the agent's own counters and collects the classes'
// from the last pass's reading: a scrape never reads the kernel, so a
// 10,000-host tree costs one dump per interval however often it is
// scraped.
type metrics struct {
	a *Agent
	// registry holds the agent's own metrics (and the Go and process
	// collectors); classes the class metrics, whose gathering is kept
	// until the next reading (gatherer).
	registry *prometheus.Registry
	classes  *prometheus.Registry
	// extras holds the class metrics but the per-class sums (policers,
	// sharing, EDT delays): a text scrape writes the sums itself
	// (scrape.go) and gathers these. named has each class metric's name
	// and help.
	extras   *prometheus.Registry
	named    map[*prometheus.Desc][2]string
	gatherer prometheus.Gatherers

	mu      sync.Mutex
	cacheOf *stats.Sample
	cache   []*dto.MetricFamily

	reconciles   *prometheus.CounterVec
	reloads      *prometheus.CounterVec
	repairs      prometheus.Counter
	shareWrites  prometheus.Counter
	earlySteps   prometheus.Counter
	autoWrites   prometheus.Counter
	hostEdits    prometheus.Counter
	steady       prometheus.Counter
	applySeconds prometheus.Histogram

	sentBytes, sentPackets, dropped, overlimits *prometheus.Desc
	backlog, rate, ceil, policer, edtDelay, rtt *prometheus.Desc
	hostRTT                                     *prometheus.Desc // with --host-metrics only
	shareDemand, shareShare, shareLimit         *prometheus.Desc
	// The names before base units, kept one release.
	oldRate, oldCeil, oldDemand, oldShare, oldLimit *prometheus.Desc
}

func newMetrics(a *Agent) *metrics {
	labels := []string{"device", "direction", "class"}
	if a.cfg.HostMetrics {
		labels = append(labels, "host")
	}
	named := map[*prometheus.Desc][2]string{}
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		d := prometheus.NewDesc(name, help, append(append([]string(nil), labels...), extra...), nil)
		named[d] = [2]string{name, help}
		return d
	}
	m := &metrics{a: a, registry: prometheus.NewRegistry(), classes: prometheus.NewRegistry(), extras: prometheus.NewRegistry(), named: named,
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_reconcile_total",
			Help: "Reconcile passes by result: ok (nothing to do), repaired (drift undone), applied (new or reloaded policy), error."}, []string{"result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_reload_total",
			Help: "Policy reloads by result: ok, or refused (the policy did not validate; the one in force stays)."}, []string{"result"}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_drift_repairs_total",
			Help: "Kernel objects changed behind the agent's back and put back (one per object)."}),
		shareWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_sharing_writes_total",
			Help: "Class ceils the sharing controllers wrote (a limit applied, changed or lifted)."}),
		earlySteps: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_sharing_early_steps_total",
			Help: "Sharing controller steps taken before their quantum was up, on a class that started sending (a load start)."}),
		autoWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_autorate_writes_total",
			Help: "Rates rate: auto wrote to the kernel (the tree planned again at the new rate, written through the engine)."}),
		hostEdits: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_host_edits_total",
			Help: "Hosts whose rate or ceil a hosts_file edit changed in place (EDT trees: their map entries written, nothing planned again)."}),
		steady: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_steady_passes_total",
			Help: "Passes that read only the counters: no tc or link change notified since the last pass that read every tree back (at most 10 s before)."}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_apply_duration_seconds",
			Help:    "Duration of a reconcile pass: plan, read every tree back, apply the difference.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
		sentBytes:   desc("sluice_class_sent_bytes_total", "Bytes the class sent (HTB class counter)."),
		sentPackets: desc("sluice_class_sent_packets_total", "Packets the class sent."),
		dropped:     desc("sluice_class_dropped_packets_total", "Packets dropped in the class (its leaf queue's drops included)."),
		overlimits:  desc("sluice_class_overlimits_total", "Times the class was over its rate and had to wait or borrow."),
		backlog:     desc("sluice_class_backlog_bytes", "Bytes queued in the class now."),
		rate:        desc("sluice_class_rate_bytes_per_second", "Configured guaranteed rate, bytes per second."),
		ceil:        desc("sluice_class_ceil_bytes_per_second", "Configured ceiling, bytes per second."),
		oldRate:     desc("sluice_class_rate_bytes", "Deprecated (removed in the next release): sluice_class_rate_bytes_per_second."),
		oldCeil:     desc("sluice_class_ceil_bytes", "Deprecated (removed in the next release): sluice_class_ceil_bytes_per_second."),
		policer:     desc("sluice_policer_packets_total", "Packets a BPF policer metered, by colour (red is dropped).", "color"),
		edtDelay:    desc("sluice_edt_delay_seconds", "How long the EDT backend held the class's packets back (its departure time minus its arrival), per class."),
		rtt:         desc("sluice_rtt_seconds", "Round trips of the class's TCP flows, timed from their own packets (an interface's rtt: on): from sluice's classification through its queue and the path, until the echo of the packet's timestamp comes back."),
		hostRTT:     desc("sluice_host_rtt_seconds", "Round trips of the host's TCP flows, as sluice_rtt_seconds times its class's (a quarter octave coarse; hosts with samples only)."),
		shareDemand: desc("sluice_sharing_demand_bytes_per_second", "What the sharing controller counted the class as wanting over its last quantum, bytes per second (its ceil when it was held back)."),
		shareShare:  desc("sluice_sharing_share_bytes_per_second", "The class's weighted max-min share of its parent's capacity, bytes per second."),
		shareLimit:  desc("sluice_sharing_limit_bytes_per_second", "What the sharing controller holds the class to now, bytes per second: its share, as the class's guaranteed rate (a controller without a cap, over an HTB tree) or as its ceil; while no limit is applied, the configured ceil, or under a cap the child's open share (what it would get wanting its ceil)."),
		oldDemand:   desc("sluice_sharing_demand_bits", "Deprecated (removed in the next release): sluice_sharing_demand_bytes_per_second, in bits per second."),
		oldShare:    desc("sluice_sharing_share_bits", "Deprecated (removed in the next release): sluice_sharing_share_bytes_per_second, in bits per second."),
		oldLimit:    desc("sluice_sharing_limit_bits", "Deprecated (removed in the next release): sluice_sharing_limit_bytes_per_second, in bits per second."),
	}
	// Every result from the start, at 0: an alert on refusals needs the
	// series before the first one.
	for _, r := range []string{"ok", "refused"} {
		m.reloads.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "repaired", "applied", "error"} {
		m.reconciles.WithLabelValues(r)
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_build_info",
		Help: "Always 1: the sluice build, in its labels.", ConstLabels: prometheus.Labels{"version": version.String(), "commit": version.Commit(), "goversion": runtime.Version()}})
	build.Set(1)
	healthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_healthy",
		Help: "1 while the policy is in force (what /healthz answers 200 to), else 0."}, func() float64 {
		if ok, _ := a.Healthy(); ok {
			return 1
		}
		return 0
	})
	lastOK := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_last_success_timestamp_seconds",
		Help: "When the last reconcile pass that worked started (Unix time; 0 before the first)."}, func() float64 {
		a.mu.RLock()
		defer a.mu.RUnlock()
		if a.health.LastSuccess.IsZero() {
			return 0
		}
		return float64(a.health.LastSuccess.UnixNano()) / 1e9
	})
	if a.cfg.Kubernetes != nil {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_kubernetes_caps_unreadable",
			Help: "Pods whose bandwidth annotation cannot be read, held at their last good cap or their class's per-pod rate (fail closed)."}, func() float64 {
			if a.kube == nil {
				return 0
			}
			return float64(a.kube.Status().CapsUnreadable)
		}))
	}
	m.registry.MustRegister(m.reconciles, m.reloads, m.repairs, m.shareWrites, m.earlySteps, m.autoWrites, autoCollector{a}, m.hostEdits, m.steady, m.applySeconds, build, healthy, lastOK,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.classes.MustRegister(m)
	m.extras.MustRegister(extrasCollector{m})
	m.gatherer = prometheus.Gatherers{m.registry, prometheus.GathererFunc(m.gatherClasses)}
	return m
}

// gatherClasses gathers the class metrics once per reading: with
// per-host series a 10,000-host tree is 70,000 of them, and scrapes
// between two passes share the work.
func (m *metrics) gatherClasses() ([]*dto.MetricFamily, error) {
	_, fams, err := m.classFamilies()
	return fams, err
}

// classFamilies is gatherClasses with the reading they are of.
func (m *metrics) classFamilies() (*stats.Sample, []*dto.MetricFamily, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.a.mu.RLock()
	s := m.a.sample
	m.a.mu.RUnlock()
	if s != nil && s == m.cacheOf {
		return s, m.cache, nil
	}
	fams, err := m.classes.Gather()
	if err != nil {
		return nil, nil, err
	}
	m.cacheOf, m.cache = s, fams
	return s, fams, nil
}

// Describe sends the class metrics' descriptions.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.sentBytes, m.sentPackets, m.dropped, m.overlimits, m.backlog, m.rate, m.ceil, m.policer, m.edtDelay,
		m.shareDemand, m.shareShare, m.shareLimit, m.oldRate, m.oldCeil, m.oldDemand, m.oldShare, m.oldLimit, m.hostRTT} {
		ch <- d
	}
}

// Collect sends the class metrics of the last reading.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.a.mu.RLock()
	s := m.a.sample
	m.a.mu.RUnlock()
	if s == nil {
		return
	}
	order, sums := m.sums(s)
	for _, key := range order {
		x := sums[key]
		for _, v := range m.sumValues(x) {
			ch <- prometheus.MustNewConstMetric(v.d, v.t, v.val, x.lv...)
		}
	}
	m.collectExtras(ch, s)
	for _, h := range m.hostRTTs(s) {
		buckets := make(map[float64]uint64, len(hostRTTBounds))
		for i, le := range hostRTTBounds {
			buckets[le] = h.below[i]
		}
		ch <- prometheus.MustNewConstHistogram(m.hostRTT, h.count, h.sum, buckets, h.lv...)
	}
}

// hostRTTBounds are sluice_host_rtt_seconds' upper bounds, 2.1 ms to
// 268 ms an octave apart: edges of a host's histogram (whose buckets are
// a quarter octave), so that each counts exactly the samples at or
// below it. Eleven series a host; the class's sluice_rtt_seconds has 21.
var hostRTTBounds = func() []float64 {
	edges := bpf.HostRTTBucketBounds()
	var out []float64
	for o := 5; o <= 12; o++ {
		out = append(out, edges[4*o-1]) // bucket 4o-1's top: the octave's edge
	}
	return out
}()

// hostRTT is one host's sluice_host_rtt_seconds series: its labels, and
// its samples below each of hostRTTBounds.
type hostRTT struct {
	key   string // the registry's sort order
	lv    []string
	count uint64
	sum   float64
	below []uint64
}

// hostRTTs are the host round-trip series of reading s (with
// --host-metrics: hosts with samples), in the order the registry sorts
// them (by class, device, direction, host).
func (m *metrics) hostRTTs(s *stats.Sample) []hostRTT {
	if !m.a.cfg.HostMetrics {
		return nil
	}
	edges := bpf.HostRTTBucketBounds()
	var out []hostRTT
	for _, t := range s.Trees {
		if t.Missing {
			continue
		}
		for _, c := range t.Classes {
			if c.RTT == nil || c.RTT.HostHist() == nil || c.RTT.Samples == 0 {
				continue
			}
			h := c.RTT.HostHist()
			i := strings.LastIndexByte(c.Name, '/')
			x := hostRTT{lv: []string{t.Interface, t.Direction, c.Name[:i], c.Name[i+1:]}, count: uint64(h.Count),
				sum: float64(h.Sum) / 1e9, below: make([]uint64, len(hostRTTBounds))}
			// Bucket k counts below a bound at or above its top edge.
			var n uint64
			b := 0
			for k, v := range h.B {
				edge := math.Inf(1)
				if k < len(edges) {
					edge = edges[k]
				}
				for ; b < len(hostRTTBounds) && edge > hostRTTBounds[b]; b++ {
					x.below[b] = n
				}
				n += uint64(v)
			}
			for ; b < len(hostRTTBounds); b++ {
				x.below[b] = n
			}
			x.key = x.lv[2] + "\x00" + x.lv[0] + "\x00" + x.lv[1] + "\x00" + x.lv[3]
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b hostRTT) int { return strings.Compare(a.key, b.key) })
	return out
}

// classSum is one class's counters, its copies in a sharded tree's
// shards added up.
type classSum struct {
	lv                                  []string
	bytes, packets, drops, over, backlg float64
	rate, ceil                          float64
}

type sumValue struct {
	d   *prometheus.Desc
	t   prometheus.ValueType
	val float64
}

// value is the f'th of a class's nine values, in sumValues' order.
func (x *classSum) value(f int) float64 {
	return [9]float64{x.bytes, x.packets, x.drops, x.over, x.backlg, x.rate, x.ceil, x.rate, x.ceil}[f]
}

// sumValues is a class's nine series: the first four counters, the
// rest gauges, with the deprecated names of rate and ceil last.
func (m *metrics) sumValues(x *classSum) [9]sumValue {
	ds := [9]*prometheus.Desc{m.sentBytes, m.sentPackets, m.dropped, m.overlimits, m.backlog, m.rate, m.ceil, m.oldRate, m.oldCeil}
	var out [9]sumValue
	for f, d := range ds {
		t := prometheus.GaugeValue
		if f < 4 {
			t = prometheus.CounterValue
		}
		out[f] = sumValue{d, t, x.value(f)}
	}
	return out
}

// sums adds up the reading's classes by series, in the order the
// registry would sort them.
func (m *metrics) sums(s *stats.Sample) ([]string, map[string]*classSum) {
	hosts := m.a.cfg.HostMetrics
	var order []string
	sums := map[string]*classSum{}
	for _, t := range s.Trees {
		if t.Missing {
			continue
		}
		for _, c := range t.Classes {
			class, host := c.Name, ""
			if c.Name == "?" {
				continue // not sluice's (a class added by hand): no stable name
			}
			if IsHostClass(c.Name) {
				if !hosts {
					continue
				}
				i := strings.LastIndexByte(c.Name, '/')
				class, host = c.Name[:i], c.Name[i+1:]
			}
			lv := []string{t.Interface, t.Direction, class}
			if hosts {
				lv = append(lv, host)
			}
			// The registry sorts each family by label values (in label
			// name order: class, device, direction, host); handed over
			// sorted, that sort is linear, which matters at 90,000 series.
			key := class + "\x00" + t.Interface + "\x00" + t.Direction + "\x00" + host
			x := sums[key]
			if x == nil {
				x = &classSum{lv: lv, rate: float64(c.Rate), ceil: float64(c.Ceil)}
				sums[key] = x
				order = append(order, key)
			}
			x.bytes += float64(c.Bytes)
			x.packets += float64(c.Packets)
			x.drops += float64(c.Drops)
			x.over += float64(c.Overlimits)
			x.backlg += float64(c.Backlog)
		}
	}
	sort.Strings(order)
	return order, sums
}

// extrasCollector collects the class metrics but the sums.
type extrasCollector struct{ m *metrics }

func (e extrasCollector) Describe(ch chan<- *prometheus.Desc) {
	m := e.m
	for _, d := range []*prometheus.Desc{m.policer, m.edtDelay, m.rtt, m.shareDemand, m.shareShare, m.shareLimit, m.oldDemand, m.oldShare, m.oldLimit} {
		ch <- d
	}
}

func (e extrasCollector) Collect(ch chan<- prometheus.Metric) {
	e.m.a.mu.RLock()
	s := e.m.a.sample
	e.m.a.mu.RUnlock()
	if s != nil {
		e.m.collectExtras(ch, s)
	}
}

// collectExtras sends the policers', sharing's and EDT delays' metrics.
func (m *metrics) collectExtras(ch chan<- prometheus.Metric, s *stats.Sample) {
	hosts := m.a.cfg.HostMetrics
	for _, t := range s.Trees {
		if t.Missing {
			continue
		}
		for _, p := range t.Policers {
			lv := []string{t.Interface, t.Direction, p.Class}
			if hosts {
				lv = append(lv, "")
			}
			for _, col := range []struct {
				name string
				n    uint64
			}{{"green", p.Green.Packets}, {"yellow", p.Yellow.Packets}, {"red", p.Red.Packets}} {
				ch <- prometheus.MustNewConstMetric(m.policer, prometheus.CounterValue, float64(col.n), append(lv, col.name)...)
			}
		}
		for _, sh := range t.Sharing {
			lv := []string{t.Interface, t.Direction, sh.Class}
			if hosts {
				lv = append(lv, "")
			}
			limit := sh.Ceil
			if sh.Applied {
				limit = sh.Limit
			}
			ch <- prometheus.MustNewConstMetric(m.shareDemand, prometheus.GaugeValue, float64(sh.Demand), lv...)
			ch <- prometheus.MustNewConstMetric(m.shareShare, prometheus.GaugeValue, float64(sh.Share), lv...)
			ch <- prometheus.MustNewConstMetric(m.shareLimit, prometheus.GaugeValue, float64(limit), lv...)
			ch <- prometheus.MustNewConstMetric(m.oldDemand, prometheus.GaugeValue, sh.Demand.BitsFloat(), lv...)
			ch <- prometheus.MustNewConstMetric(m.oldShare, prometheus.GaugeValue, sh.Share.BitsFloat(), lv...)
			ch <- prometheus.MustNewConstMetric(m.oldLimit, prometheus.GaugeValue, limit.BitsFloat(), lv...)
		}
		for _, d := range t.Delays {
			lv := []string{t.Interface, t.Direction, d.Class}
			if hosts {
				lv = append(lv, "")
			}
			var count uint64
			buckets := make(map[float64]uint64, len(d.Packets))
			for k, n := range d.Packets {
				count += n
				if k > 0 && d.UpperNS[k] > 0 {
					buckets[float64(d.UpperNS[k])/1e9] = count
				}
			}
			ch <- prometheus.MustNewConstHistogram(m.edtDelay, count, float64(d.SumNS)/1e9, buckets, lv...)
		}
		for _, c := range t.Classes {
			if c.RTT == nil || IsHostClass(c.Name) {
				continue
			}
			lv := []string{t.Interface, t.Direction, c.Name}
			if hosts {
				lv = append(lv, "")
			}
			count, sum, buckets := rttBuckets(c.RTT.Hist())
			ch <- prometheus.MustNewConstHistogram(m.rtt, count, sum, buckets, lv...)
		}
	}
}

// rttBounds are the upper bounds (seconds) sluice_rtt_seconds exports:
// the program's histogram has 336 buckets, a sixteenth of an octave
// each, too many series for a scrape.
var rttBounds = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5}

// rttBuckets folds a program's round-trip histogram into rttBounds'
// cumulative counts. A fine bucket counts under the first bound at or
// above its own upper edge (so a bound's count never holds a sample
// above it).
func rttBuckets(h *bpf.RTTHist) (uint64, float64, map[float64]uint64) {
	out := make(map[float64]uint64, len(rttBounds))
	edges := bpf.RTTBucketBounds()
	var count uint64
	for _, n := range h.B {
		count += n
	}
	for _, le := range rttBounds {
		var c uint64
		for k, n := range h.B {
			if k < len(edges) && edges[k] <= le {
				c += n
			}
		}
		out[le] = c
	}
	return count, float64(h.Sum) / 1e9, out
}
