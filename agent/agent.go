// Package agent keeps a policy applied for as long as it runs, and shows
// it working.
//
// Every interval the agent plans its policy against the kernel, reading
// every tree back (engine.Options.Full), and applies the difference: a
// class changed with tc, a root qdisc replaced, a device that went and
// came back, a detached BPF program are each repaired, logged and
// counted. An edit of the policy file (or a hosts_file), or SIGHUP,
// reloads it with exactly the semantics of `sluice apply`; a policy that
// does not validate is refused and the one in force stays. Devices that
// do not exist are waited for while the others are shaped.
//
// The same pass reads the class counters once (stats.Collect), and
// everything the agent serves comes from that reading: Prometheus
// metrics at /metrics, JSON at /api/v1/status, a live dashboard at /.
package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sluice/engine"
	"sluice/kernel"
	"sluice/kube"
	"sluice/plan"
	"sluice/policy"
	"sluice/records"
	"sluice/safefile"
	"sluice/stats"
)

// Config says what the agent keeps applied and where it listens.
type Config struct {
	// Policy is the policy file.
	Policy string
	// Netns is the network namespace to shape ("": the agent's own).
	Netns string
	// Listen is the HTTP address for metrics, the API and the dashboard
	// ("": none).
	Listen string
	// Interval between reconcile passes (default 1 s).
	Interval time.Duration
	// ResetOnExit removes what the agent applied when it stops.
	ResetOnExit bool
	// Kubernetes, when set, lists this node's pods as the hosts of the
	// policy's pods classes (per_host: {pods: ...}; docs/kubernetes.md).
	// Its Log and Changed are the agent's.
	Kubernetes *kube.Config
	// HostMetrics labels per-host classes with `host` in the metrics;
	// without it they are left out (their parent class counts them), to
	// bound the number of series.
	HostMetrics bool
	// History is how many passes the dashboard's charts keep (default
	// 300: five minutes at 1 s).
	History int
	// Log receives the agent's log (default: slog.Default()).
	Log *slog.Logger
	// Transform, if set, changes each policy the agent loads before it
	// is planned (a test bed that runs a policy at scaled rates).
	Transform func(*policy.Policy)
	// AllowHosts are names the HTTP server answers to besides IP
	// addresses, localhost and this machine's name (--allow-host).
	AllowHosts []string
}

// AgentFile is the file in the namespace's state directory that says
// where a running agent listens (for `sluice show`).
const AgentFile = "agent.json"

// ListenRetry is how often the agent tries --listen's address again
// while another process holds it.
var ListenRetry = 2 * time.Second

// Info is what AgentFile holds.
type Info struct {
	PID    int    `json:"pid"`
	Listen string `json:"listen"`
	Policy string `json:"policy"`
}

// Agent is a running agent. Its exported methods are safe for
// concurrent use.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	lock *records.Lock
	opts engine.Options
	// sess is the engine session every write goes through: passes, and
	// the controllers' limits laid over them.
	sess    *engine.Session
	metrics *metrics
	reload  chan bool // true: forced (SIGHUP)
	// kick asks the loop to look at the files now (the pods files were
	// written); kube writes them, stopKube ends its watch.
	kick     chan struct{}
	kube     *kube.Watcher
	stopKube context.CancelFunc

	// Owned by the loop.
	pol      *policy.Policy
	watched  watched // the files pol was read from
	settling []stamp // the files' stamps at the last poll, while they move
	recorded bool    // the records say what pol plans
	// inForce is the plan the kernel was last seen to hold (nil when
	// the last pass did not end so), and base what pol was read from
	// (the contents the parser saw): what a hosts_file edit patches.
	inForce *plan.Plan
	base    *watched
	// reloaded is a reload's policy as it planned against the kernel
	// (reloadPolicy's check that it can be applied here), which the
	// reload's pass applies instead of planning and reading it again.
	reloaded   *engine.Prepared
	prevSample *stats.Sample
	// failures are the last failures logged, by message.
	failures map[string]failure
	// ctls are the running sharing controllers (sharing.go), by device
	// and owner; tick is the pass interval in force: the configured
	// one, or a shorter controller quantum.
	ctls map[string]*controller
	tick time.Duration
	// autos are the rate: auto controllers by device, probers their
	// reflectors' probers by reflectors and mode (autorate.go); the
	// probers' goroutines send autoEvents; autoK reads the counters.
	autos      map[string]*autoTree
	probers    map[string]*autoProber
	autoEvents chan autoEvent
	autoK      *kernel.Reader

	mu     sync.RWMutex
	health Health
	sample *stats.Sample
	auto   []AutoStatus
	// autoPublished is when auto was last published (publishAuto).
	autoPublished time.Time
	hist          *history
	started       time.Time
	gen           uint64 // moves with every change of health, sample or hist

	// The HTTP server's: replies encoded once per generation, and the
	// Host names it answers to besides IP addresses and localhost.
	replies   replies
	hostNames []string
}

type failure struct {
	err string
	at  time.Time
}

// Health is the agent's own state, as /api/v1/status shows it.
type Health struct {
	Policy        string    `json:"policy"`
	Netns         string    `json:"netns,omitzero"`
	Started       time.Time `json:"started"`
	IntervalS     float64   `json:"interval_s"`
	LastReconcile time.Time `json:"last_reconcile"`
	// LastResult is ok (nothing to do), repaired (drift undone),
	// applied (a new or reloaded policy) or error.
	LastResult string `json:"last_result"`
	LastError  string `json:"last_error,omitzero"`
	// LastSuccess is when the last pass that worked started.
	LastSuccess time.Time `json:"last_success,omitzero"`
	Reconciles  uint64    `json:"reconciles"`
	Repairs     uint64    `json:"repairs"`
	LastRepair  time.Time `json:"last_repair,omitzero"`
	LastReload  time.Time `json:"last_reload,omitzero"`
	ReloadError string    `json:"reload_error,omitzero"`
	// Waiting names interfaces of the policy that do not exist now.
	Waiting []string `json:"waiting,omitzero"`
	// ApplySeconds is how long the last pass took.
	ApplySeconds float64 `json:"apply_seconds"`
}

// InputError is a bad configuration or starting policy.
type InputError = engine.InputError

// New checks cfg, loads the policy and takes the namespace's agent lock.
// A policy that does not validate is an *InputError.
func New(cfg Config) (*Agent, error) {
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < 100*time.Millisecond || cfg.Interval > time.Hour {
		return nil, &InputError{Err: fmt.Errorf("--interval %s: must be between 100ms and 1h", cfg.Interval)}
	}
	if cfg.History == 0 {
		cfg.History = 300
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Listen != "" {
		if err := checkListen(cfg.Listen); err != nil {
			return nil, &InputError{Err: fmt.Errorf("--listen %q: %w", cfg.Listen, err)}
		}
	}
	if cfg.Netns != "" {
		if err := records.ValidNetnsName(cfg.Netns); err != nil {
			return nil, &InputError{Err: fmt.Errorf("--netns: %w", err)}
		}
	}
	a := &Agent{cfg: cfg, log: cfg.Log, reload: make(chan bool, 1), kick: make(chan struct{}, 1), failures: map[string]failure{}, hist: newHistory(cfg.History), started: time.Now(),
		tick: cfg.Interval, autoEvents: make(chan autoEvent, 256)}
	a.opts = engine.Options{Netns: cfg.Netns, Full: true, SkipMissing: true, LockTimeout: 30 * time.Second,
		Warn: func(s string) { a.log.Warn(s) }}
	a.sess = engine.NewSession(a.opts)
	pol, err := engine.Load(cfg.Policy, a.opts)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Agent, error) {
		if a.stopKube != nil {
			a.stopKube()
		}
		if a.lock != nil {
			a.lock.Release()
		}
		return nil, err
	}
	if cfg.Kubernetes != nil {
		// The lock first: the pods files are this agent's to write.
		if a.lock, err = records.AcquireAgentLock(records.Dir(cfg.Netns)); err != nil {
			return nil, err
		}
		if pol, err = a.startKube(pol); err != nil {
			return fail(err)
		}
	}
	if cfg.Transform != nil {
		cfg.Transform(pol)
	}
	a.pol, a.base = pol, sourcesOf(pol)
	if a.watched, err = a.watch(pol); err != nil {
		return fail(&InputError{Err: err})
	}
	a.watched = unseen(a.watched, a.base)
	if a.lock == nil {
		if a.lock, err = records.AcquireAgentLock(records.Dir(cfg.Netns)); err != nil {
			return nil, err
		}
	}
	a.metrics = newMetrics(a)
	a.hostNames = hostNames(cfg.AllowHosts)
	a.health = Health{Policy: cfg.Policy, Netns: cfg.Netns, Started: a.started, IntervalS: cfg.Interval.Seconds()}
	return a, nil
}

// checkListen checks an HTTP address: HOST:PORT with HOST empty, an IP
// address or a name, PORT 0 to 65535.
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if strings.ContainsAny(host, ":") && net.ParseIP(host) == nil {
		return fmt.Errorf("host %q is not an IP address", host)
	}
	if ip := net.ParseIP(host); ip == nil && host != "" {
		for _, r := range host {
			if !(r == '.' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				return fmt.Errorf("host %q is neither an IP address nor a host name", host)
			}
		}
		if strings.Trim(host, "0123456789.") == "" {
			return fmt.Errorf("host %q is not an IP address", host)
		}
	}
	return nil
}

// watched is what the policy was last read from: its files (the policy
// file, then every hosts_file), their contents, and a stamp of each, so
// that a poll costs a stat per file and reads only when a stamp moved.
// The contents are kept (rather than a hash) so that an edit of a
// hosts_file can be worked out line by line (policy.EditHosts).
type watched struct {
	files  []string
	data   [][]byte
	stamps []stamp
}

// sourcesOf is what pol was read from: its files with the contents the
// parser saw (nil if one is missing), whatever the files hold now.
func sourcesOf(pol *policy.Policy) *watched {
	w := watched{files: pol.Files()}
	for _, f := range w.files {
		b := pol.Source(f)
		if b == nil {
			return nil
		}
		w.data = append(w.data, b)
	}
	return &w
}

// unseen is what to watch after a load that read base, when w was read
// just after it: w itself, or, where a file changed in between, base's
// contents without stamps, so that the next poll reads the files again
// and takes the change as an edit (it would otherwise wait for the
// next one).
func unseen(w watched, base *watched) watched {
	if base == nil || w.same(*base) {
		return w
	}
	return watched{files: base.files, data: base.data, stamps: make([]stamp, len(base.files))}
}

// same says whether w and o hold the same files with the same contents.
func (w watched) same(o watched) bool {
	return slices.Equal(w.files, o.files) && slices.EqualFunc(w.data, o.data, bytes.Equal)
}

type stamp struct {
	dev, ino, size uint64
	mtime, ctime   int64
}

func stampOf(f string) stamp {
	var st unix.Stat_t
	if unix.Stat(f, &st) != nil {
		return stamp{}
	}
	return stamp{uint64(st.Dev), uint64(st.Ino), uint64(st.Size), st.Mtim.Nano(), st.Ctim.Nano()}
}

// watch hashes and stamps the files pol was read from (with a nil pol,
// only the policy file: what to watch after an edit that does not parse).
func (a *Agent) watch(pol *policy.Policy) (watched, error) {
	if pol != nil {
		return a.watchFiles(pol.Files())
	}
	return a.watchFiles([]string{a.cfg.Policy})
}

// watchFiles stamps and reads files. One that cannot be read (deleted)
// has no data and a zero stamp, and the first such error is returned:
// the others are still watched, so that putting it back is seen.
func (a *Agent) watchFiles(files []string) (watched, error) {
	w := watched{files: files}
	var first error
	for _, f := range w.files {
		// Stamped before reading: a write in between shows at the next poll.
		st := stampOf(f)
		b, err := safefile.ReadRegular(f, "policy file", policy.MaxHostsFileBytes)
		if err != nil {
			first = cmp.Or(first, err)
			st, b = stamp{}, nil
		}
		w.stamps, w.data = append(w.stamps, st), append(w.data, b)
	}
	return w, first
}

// Reload asks the loop to re-read the policy now (SIGHUP), even if its
// files look unchanged.
func (a *Agent) Reload() {
	select {
	case a.reload <- true:
	default:
	}
}

// Run serves HTTP (when configured) and reconciles until ctx ends, then
// leaves the shaping in place, or removes it with ResetOnExit. It
// releases the agent lock on return.
func (a *Agent) Run(ctx context.Context) error {
	defer a.lock.Release()
	if a.stopKube != nil {
		defer a.stopKube()
	}
	defer a.sess.Close()
	dir := records.Dir(a.cfg.Netns)
	// Who keeps the namespace, with which policy: apply and plan read it
	// (an apply beside the agent would be undone), show where it listens.
	policyPath, err := filepath.Abs(a.cfg.Policy)
	if err != nil {
		policyPath = a.cfg.Policy
	}
	info := Info{PID: os.Getpid(), Policy: policyPath}
	writeInfo := func() {
		b, _ := json.Marshal(info)
		if err := records.WriteAgentFile(dir, AgentFile, b); err != nil {
			a.log.Warn("cannot write the agent file; sluice show will read the kernel itself, and apply cannot say which policy the agent keeps", "err", err)
		}
	}
	writeInfo()
	a.log.Info("agent started", "policy", a.cfg.Policy, "netns", a.cfg.Netns, "interval", a.cfg.Interval.String())
	// Shape first, serve second: a user holding --listen's port (an
	// unprivileged one) must not keep the policy from being applied.
	// The address is tried again every ListenRetry until it frees.
	a.pass("start")
	var srv *http.Server
	retry := time.NewTicker(ListenRetry)
	retry.Stop()
	defer retry.Stop()
	var listenC <-chan time.Time
	listen := func() {
		ln, err := listenHTTP(a.cfg.Listen)
		if err != nil {
			if listenC == nil {
				a.log.Warn("cannot listen; shaping goes on, and the address is tried again", "addr", a.cfg.Listen, "every", ListenRetry.String(), "err", err)
				retry.Reset(ListenRetry)
				listenC = retry.C
			}
			return
		}
		retry.Stop()
		listenC = nil
		srv = a.serve(ln)
		info.Listen = ln.Addr().String()
		writeInfo()
		a.log.Info("listening", "addr", ln.Addr().String())
	}
	if a.cfg.Listen != "" {
		listen()
	}
	defer func() {
		a.stopAuto()
		if a.autoK != nil {
			a.autoK.Close()
		}
	}()
	// rate: auto's controllers step every AutoEvery while there are any.
	auto := time.NewTicker(AutoEvery)
	auto.Stop()
	defer auto.Stop()
	var autoC <-chan time.Time
	syncAutoTick := func() {
		switch {
		case len(a.autos) > 0 && autoC == nil:
			auto.Reset(AutoEvery)
			autoC = auto.C
		case len(a.autos) == 0 && autoC != nil:
			auto.Stop()
			autoC = nil
		}
	}
	syncAutoTick()

	tick := time.NewTicker(a.tick)
	defer tick.Stop()
	every := a.tick
	// Load starts are looked for between the sharing controllers'
	// quanta (watchStarts), while there are controllers.
	starts := time.NewTimer(StartWatch)
	defer starts.Stop()
	// Files are checked at least twice a second, so that an edit is in
	// force within a second whatever the interval.
	watch := time.NewTicker(min(a.cfg.Interval, 500*time.Millisecond))
	defer watch.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			a.pass("interval")
		case <-starts.C:
			starts.Reset(a.watchStarts())
			continue
		case <-listenC:
			listen()
			continue
		case <-watch.C:
			if changed, now := a.filesChanged(); changed && !a.editHosts(now) {
				a.reloadPolicy(false)
			}
		case <-a.kick:
			if changed, now := a.filesChanged(); changed && !a.editHosts(now) {
				a.reloadPolicy(false)
			}
		case <-a.reload:
			a.reloadPolicy(true)
		case ev := <-a.autoEvents:
			a.autoEvent(ev)
			continue
		case now := <-autoC:
			a.autoStep(now)
			continue
		}
		syncAutoTick()
		if a.tick != every { // a controller's quantum is shorter
			every = a.tick
			tick.Reset(every)
		}
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		srv.Shutdown(sctx)
		cancel()
	}
	if a.cfg.ResetOnExit {
		var names []string
		for _, in := range a.pol.Interfaces {
			names = append(names, in.Name)
		}
		o := a.opts
		o.LockTimeout = time.Second
		r, err := engine.Reset(names, false, o, nil)
		if err != nil {
			a.log.Error("reset on exit failed", "err", err)
			return err
		}
		a.log.Info("reset on exit", "devices", strings.Join(r.Devices, ","))
	} else {
		// The controllers' limits lapse now: the next apply puts the
		// policy's values back.
		if err := a.sess.Release(); err != nil {
			a.log.Warn("could not end the limits' lease; they lapse on their own", "err", err)
		}
		a.log.Info("stopped; shaping left in place")
	}
	return nil
}

// filesChanged reports whether the policy's files differ from those in
// force. A file that cannot be read counts as changed: the reload says
// why.
//
// A changed file is read only once it has settled: replaced by a rename
// (a new inode: written whole, as editors and config tools that write
// safely do), or unchanged since the last poll. A file being written
// in place parses at many points on the way (a policy rewritten line
// by line over 3 s once lost 10 of its 12 classes for a moment, a hosts
// file 45 hosts).
func (a *Agent) filesChanged() (bool, watched) {
	w := a.watched
	cur := make([]stamp, len(w.files))
	same, settled := true, true
	for i, f := range w.files {
		cur[i] = stampOf(f)
		if cur[i] == w.stamps[i] {
			continue
		}
		same = false
		renamed := cur[i].ino != w.stamps[i].ino && cur[i] != (stamp{}) && w.stamps[i] != (stamp{})
		still := len(a.settling) == len(cur) && a.settling[i] == cur[i]
		settled = settled && (renamed || still)
	}
	if same || !settled {
		a.settling = nil
		if !same {
			a.settling = cur
		}
		return false, w
	}
	a.settling = nil
	now, err := a.watchFiles(w.files)
	if err == nil && now.same(w) {
		a.watched = now // touched, not changed
		return false, now
	}
	return true, now
}

// editHosts takes an edit of hosts_files that changes only hosts'
// rates and ceils into the kernel and the policy and plan in force
// (engine.Session.EditHosts): with 100,000 hosts, microseconds of
// writes instead of planning them all again. It reports false where
// the edit needs the full reload (anything else, or a kernel that does
// not hold what the agent planned); a line Load would refuse is refused
// here as the reload refuses it, and the policy in force stays.
func (a *Agent) editHosts(now watched) bool {
	if a.base == nil {
		return false
	}
	old := *a.base
	// A file that could not be read (deleted) has no data: the full
	// reload says why. The policy file itself is files[0].
	if a.inForce == nil || !slices.Equal(old.files, now.files) || len(now.data) != len(now.files) ||
		slices.ContainsFunc(now.data, func(b []byte) bool { return b == nil }) ||
		!bytes.Equal(old.data[0], now.data[0]) {
		return false
	}
	start := time.Now()
	var changes []engine.HostsChange
	for i := 1; i < len(now.files); i++ {
		changes = append(changes, engine.HostsChange{File: now.files[i], Old: old.data[i], New: now.data[i]})
	}
	ed, ok, err := a.sess.EditHosts(a.pol, a.inForce, changes)
	var ie *engine.InputError
	switch {
	case errors.As(err, &ie):
		a.watched = now // reported once, not every poll
		a.refused(err)
		return true
	case err != nil:
		a.log.Warn("hosts edit: writing in place failed; reloading in full", "err", err.Error())
		return false
	case !ok:
		return false
	}
	a.watched, a.base = now, &now
	if ed.Hosts() == 0 {
		// The files hold what the policy in force was read from: put
		// back after a refused edit or a deletion. Nothing to write.
		a.log.Info("files are back as the policy in force read them; nothing changes", "policy", a.cfg.Policy)
		a.mu.Lock()
		a.gen++
		a.health.ReloadError = ""
		a.mu.Unlock()
		return true
	}
	a.recorded = false // the next pass brings the records up to date
	a.log.Info("hosts edited in place", "hosts", ed.Hosts(), "entries", ed.Entries(), "took", time.Since(start).String())
	a.metrics.reloads.WithLabelValues("ok").Inc()
	a.metrics.hostEdits.Add(float64(ed.Hosts()))
	a.mu.Lock()
	a.gen++
	a.health.LastReload, a.health.ReloadError = time.Now(), ""
	a.mu.Unlock()
	return true
}

// refused reports a policy edit that is refused; the policy in force
// stays.
func (a *Agent) refused(err error) {
	a.log.Error("policy refused; the one in force stays", "policy", a.cfg.Policy, "err", err.Error())
	a.metrics.reloads.WithLabelValues("refused").Inc()
	a.mu.Lock()
	a.gen++
	a.health.LastReload, a.health.ReloadError = time.Now(), err.Error()
	a.mu.Unlock()
}

// reloadPolicy reads the policy again; a bad one is refused and the one
// in force stays.
func (a *Agent) reloadPolicy(forced bool) {
	pol, err := engine.Load(a.cfg.Policy, a.opts)
	if pol != nil && a.cfg.Transform != nil {
		a.cfg.Transform(pol)
	}
	if pol != nil {
		// Its pods files written before they are watched: a pods class
		// new in this policy has none yet (loaded without pods; the
		// watch then sees them come). The policy in force keeps its
		// own until this one is.
		a.kubeTargets(a.pol, pol)
	}
	w, werr := a.watch(pol)
	if pol == nil || werr != nil {
		// Refused: watch the policy file and the files of the policy in
		// force, so that putting a deleted hosts_file back is seen too.
		files := []string{a.cfg.Policy}
		if a.base != nil {
			files = a.base.files
		}
		w, _ = a.watchFiles(files)
	}
	if !forced && err == nil && w.same(a.watched) {
		a.watched = w // touched, not changed
		return
	}
	a.watched = w // a bad edit is reported once, not every poll
	now := time.Now()
	if err == nil {
		// An edit that validates may still not plan on this kernel (a
		// leaf qdisc it lacks): refused like a bad one, or every pass
		// would fail and drift go unrepaired. A failure that is not the
		// policy's (the lock held, netlink busy) does not refuse it.
		p, perr := a.sess.Prepare(pol)
		var ie *engine.InputError
		if errors.As(perr, &ie) {
			err = fmt.Errorf("%s: cannot be applied here: %w", a.cfg.Policy, perr)
		} else if p != nil {
			a.reloaded = p // applied by the pass below
		}
	}
	if err != nil {
		a.refused(err)
		return
	}
	a.log.Info("policy reloaded", "policy", a.cfg.Policy, "forced", forced)
	a.metrics.reloads.WithLabelValues("ok").Inc()
	a.pol, a.recorded, a.inForce, a.base = pol, false, nil, sourcesOf(pol)
	a.kubeTargets(pol)
	a.watched = unseen(w, a.base)
	a.mu.Lock()
	a.gen++
	a.health.LastReload, a.health.ReloadError = now, ""
	a.mu.Unlock()
	a.pass("reload")
}

// pass is one reconcile: plan, read everything back, apply the
// difference, then read the counters.
func (a *Agent) pass(why string) {
	start := time.Now()
	result, changes, waiting, sample, serr, err := a.reconcile(why)
	took := time.Since(start)
	a.metrics.applySeconds.Observe(took.Seconds())
	a.metrics.reconciles.WithLabelValues(result).Inc()
	if result == "repaired" {
		a.metrics.repairs.Add(float64(changes))
	}
	a.mu.Lock()
	a.gen++
	defer a.mu.Unlock()
	h := &a.health
	h.LastReconcile, h.LastResult, h.Reconciles, h.ApplySeconds = start, result, h.Reconciles+1, took.Seconds()
	h.Waiting = waiting
	h.LastError = ""
	if err != nil {
		h.LastError = err.Error()
	} else {
		h.LastSuccess = start
	}
	if result == "repaired" {
		h.Repairs += uint64(changes)
		h.LastRepair = start
	}
	if serr != nil {
		a.logFailure("reading counters failed", why, serr)
		return
	}
	stats.Rates(a.prevSample, sample)
	a.prevSample = sample
	a.sample = sample
	a.hist.add(sample)
}

// reconcile applies the policy's difference from the kernel, and reads
// the counters after (serr: why they could not be read).
//
// A pass on the interval when nothing can have changed since the last
// one that read every tree back (engine.Session.Steady: no tc or link
// notification, the same policy, at most engine.FullEvery ago) reads
// only the counters: at 10,000 hosts that is what keeps a pass cheap.
func (a *Agent) reconcile(why string) (result string, changes int, waiting []string, sample *stats.Sample, serr, err error) {
	if why == "interval" && a.inForce != nil && a.recorded {
		t0 := time.Now()
		if sample, ok := a.sess.Steady(a.pol); ok {
			t1 := time.Now()
			if k, err := a.sess.Reader(); err == nil && hasControllers(a.inForce) {
				a.runControllers(nil, a.inForce, k, sample)
			}
			a.metrics.steady.Inc()
			a.log.Debug("pass", "why", why, "steady", true, "counters_ms", t1.Sub(t0).Milliseconds(), "controllers_ms", time.Since(t1).Milliseconds())
			return "ok", 0, nil, sample, nil, nil
		}
	}
	a.inForce = nil
	p, err := a.reloaded, error(nil)
	a.reloaded = nil
	if p == nil || why != "reload" {
		if p != nil {
			p.Close()
		}
		p, err = a.sess.Prepare(a.pol)
	}
	if err != nil {
		a.logFailure("reconcile failed", why, err)
		sample, serr = a.collect()
		return "error", 0, nil, sample, serr, err
	}
	defer p.Close()
	result, changes, err = a.apply(p, why)
	if err == nil && len(p.Missing) == 0 {
		a.inForce = p.Plan
	}
	if err == nil {
		a.syncAuto(p.Plan)
	}
	if err == nil && result == "ok" && changes == 0 {
		a.sess.Settled(a.pol, p)
	}
	t0 := time.Now()
	if result == "ok" && changes == 0 {
		sample, serr = stats.CollectFrom(p.Kernel(), p.Live.Objects)
	} else {
		sample, serr = stats.Collect(p.Kernel(), nil)
	}
	a.tick = a.cfg.Interval
	if q := minQuantum(p.Plan); q > 0 {
		a.tick = min(a.tick, q)
		// The limits hold through a few late steps, not much longer.
		a.sess.SetLease(max(engine.DefaultLease, 4*q))
	}
	if serr == nil && err == nil {
		a.runControllers(p, p.Plan, p.Kernel(), sample)
	}
	a.log.Debug("pass", "why", why, "timings", p.Phases.String(), "counters_ms", time.Since(t0).Milliseconds())
	return result, changes, p.Missing, sample, serr, err
}

func (a *Agent) apply(p *engine.Prepared, why string) (string, int, error) {
	if len(p.Missing) > 0 {
		a.log.Debug("waiting for interfaces", "missing", strings.Join(p.Missing, ","))
	}
	if p.Diff.Empty() && a.recorded && !p.Kernel().Interrupted() {
		return "ok", 0, nil // the records are current: no write
	}
	drift := why == "interval" && a.recorded && !p.Diff.Empty()
	// One line per object at debug level: a first apply of a policy
	// with hosts is hundreds of objects, which belong in the summary
	// line below, not one journal line each.
	if a.log.Enabled(context.Background(), slog.LevelDebug) {
		for _, c := range p.Diff.Changes {
			a.log.Debug("change", "why", why, "change", c.Verb.String(), "object", c.Obj.Key())
		}
	}
	res, err := p.Apply()
	if err != nil {
		a.logFailure("apply failed", why, err)
		return "error", 0, err
	}
	a.recorded = true
	clear(a.failures)
	n := len(p.Diff.Changes)
	switch {
	case n == 0:
		return "ok", 0, nil
	case drift:
		a.log.Warn("repaired drift", "changes", n, "writes", res.Writes, "summary", summarize(p.Diff.Changes))
		return "repaired", n, nil
	default:
		a.log.Info("applied", "why", why, "changes", n, "writes", res.Writes, "summary", summarize(p.Diff.Changes))
		return "applied", n, nil
	}
}

func hasControllers(p *plan.Plan) bool {
	for _, d := range p.Devices {
		if len(d.Controllers) > 0 {
			return true
		}
	}
	return false
}

// summarize says what changes do in one line: how many of each verb and
// kind, and the first few objects ("change 1 class: class/eth0/1:11";
// "add 254 class, add 254 qdisc, add 1 filter: class/eth1/1:11, ...").
func summarize(cs []kernel.Change) string {
	type key struct{ verb, kind string }
	var order []key
	count := map[key]int{}
	for _, c := range cs {
		kind, _, _ := strings.Cut(c.Obj.Key(), "/")
		k := key{c.Verb.String(), kind}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s %d %s", k.verb, count[k], k.kind))
	}
	const shown = 3
	var objs []string
	for i, c := range cs {
		if i == shown {
			objs = append(objs, fmt.Sprintf("and %d more", len(cs)-shown))
			break
		}
		objs = append(objs, c.Obj.Key())
	}
	return strings.Join(parts, ", ") + ": " + strings.Join(objs, ", ")
}

// logFailure logs a failed pass; the same failure again is logged at
// debug level, and at error level once a minute, so that a condition
// that lasts (a foreign root qdisc) does not flood the log.
func (a *Agent) logFailure(msg, why string, err error) {
	now := time.Now()
	last := a.failures[msg]
	if err.Error() == last.err && now.Sub(last.at) < time.Minute {
		a.log.Debug(msg, "why", why, "err", err.Error(), "repeated", true)
		return
	}
	a.failures[msg] = failure{err.Error(), now}
	a.log.Error(msg, "why", why, "err", err.Error())
}

// collect reads the counters without a plan (when planning failed).
func (a *Agent) collect() (*stats.Sample, error) {
	k, err := engine.Open(engine.Options{Netns: a.cfg.Netns})
	if err != nil {
		return nil, err
	}
	defer k.Close()
	return stats.Collect(k.Reader(), nil)
}

// Status is what /api/v1/status returns.
type Status struct {
	Health Health        `json:"health"`
	Sample *stats.Sample `json:"sample"`
	// HostClasses counts the per-host classes left out of Sample when
	// asked (?hosts=0).
	HostClasses int `json:"host_classes_omitted,omitzero"`
	// Autorate is each rate: auto tree's controller.
	Autorate []AutoStatus `json:"autorate,omitzero"`
	// Kubernetes is the pods watch (agent --kubernetes).
	Kubernetes *kube.Status `json:"kubernetes,omitzero"`
}

// Status returns the agent's health and its last reading; withHosts
// false leaves per-host classes out.
func (a *Agent) Status(withHosts bool) Status {
	a.mu.RLock()
	defer a.mu.RUnlock()
	st := Status{Health: a.health, Sample: a.sample, Autorate: a.auto}
	if a.kube != nil {
		ks := a.kube.Status()
		st.Kubernetes = &ks
	}
	st.Health.Waiting = append([]string(nil), a.health.Waiting...)
	if a.sample != nil && !withHosts {
		cp := &stats.Sample{At: a.sample.At}
		for _, t := range a.sample.Trees {
			cut := *t
			cut.Classes = nil
			for _, c := range t.Classes {
				if IsHostClass(c.Name) {
					st.HostClasses++
					cut.HostClasses++
					continue
				}
				cut.Classes = append(cut.Classes, c)
			}
			cp.Trees = append(cp.Trees, &cut)
		}
		st.Sample = cp
	}
	return st
}

// IsHostClass reports whether a class name is a per-host class's
// (PARENT/HOST: policy class names cannot hold a slash).
func IsHostClass(name string) bool { return strings.Contains(name, "/") }

// Healthy reports whether the policy is in force: the last pass worked
// and no interface of the policy is waited for (a policy whose devices
// are all missing shapes nothing, and once answered 200).
func (a *Agent) Healthy() (bool, string) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.health.LastResult == "error" {
		return false, a.health.LastError
	}
	if a.health.Reconciles == 0 {
		return false, "starting"
	}
	if w := a.health.Waiting; len(w) > 0 {
		return false, "waiting for " + strings.Join(w, ", ") + ": the policy is not in force there"
	}
	if a.health.ReloadError != "" {
		return true, "ok; the last edit of the policy was refused, the one before it is in force"
	}
	return true, "ok"
}

// Keeper is the agent that keeps netns (its pid and policy file, as it
// wrote them), if one runs; ok is false when none does. An agent that
// runs but could not write its file is a Keeper with no pid or policy.
func Keeper(netns string) (info Info, ok bool) {
	dir := records.Dir(netns)
	if !records.AgentRunning(dir) {
		return Info{}, false
	}
	if b, err := records.ReadAgentFile(dir, AgentFile); err == nil {
		json.Unmarshal(b, &info)
	}
	return info, true
}

// ReadStatus asks the agent running in netns (if any) for its status;
// ok is false when none answers.
func ReadStatus(netns string, timeout time.Duration) (*Status, bool) {
	dir := records.Dir(netns)
	if !records.AgentRunning(dir) {
		return nil, false
	}
	b, err := records.ReadAgentFile(dir, AgentFile)
	if err != nil {
		return nil, false
	}
	var info Info
	if json.Unmarshal(b, &info) != nil || info.Listen == "" {
		return nil, false
	}
	host, port, err := net.SplitHostPort(info.Listen)
	if err != nil {
		return nil, false
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	c := http.Client{Timeout: timeout}
	resp, err := c.Get("http://" + net.JoinHostPort(host, port) + "/api/v1/status")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	var st Status
	body := &bytes.Buffer{}
	if _, err := body.ReadFrom(http.MaxBytesReader(nil, resp.Body, 512<<20)); err != nil {
		return nil, false
	}
	if err := json.Unmarshal(body.Bytes(), &st); err != nil || st.Sample == nil {
		return nil, false
	}
	return &st, true
}
