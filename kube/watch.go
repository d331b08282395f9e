package kube

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"sluice/kube/corev1"
	"sluice/safefile"
	"sluice/units"
)

// Config is what a Watcher watches and whom it tells.
type Config struct {
	// Client reaches the API server (Client, or kubetest's fake in
	// tests).
	Client API
	// Node is this node's name: only its pods are listed and watched
	// (a field selector on spec.nodeName).
	Node string
	Log  *slog.Logger
	// Changed is called after pods files were written, so that the
	// agent takes them at once rather than at its next poll.
	Changed func()
	// Settle is how long a change waits for others to write them
	// together (default 20 ms: 1,000 pods created at once are a few
	// writes, not a thousand).
	Settle time.Duration
	// Retry is the first wait before a failed write is tried again
	// (default 1 s, doubling to 30 s). A pod whose veth is not found
	// yet (pod_veths) is looked for again as often.
	Retry time.Duration
	// Device finds a pod's own device, for a pod_veths target (nil:
	// such a target lists no pod).
	Device DeviceFunc
}

// Watcher keeps the pods files of a policy's pods classes as the API
// server says this node's pods are. It writes files and Events; it
// never touches the kernel (the agent applies the files).
type Watcher struct {
	cfg        Config
	informer   cache.SharedIndexInformer
	namespaces cache.SharedIndexInformer // their aggregates' annotations
	kick       chan struct{}

	mu      sync.Mutex
	targets []Target
	written map[string][]byte // what each file was last written with
	told    map[string]bool   // Events sent: object UID + a hash of the problem
	tells   map[string]int    // problems told per object UID (at most MaxTells)
	writes  int
	lastErr error
	// pending counts the pods whose veth the last write did not find
	// yet (pod_veths): the loop looks again.
	pending int
	// goodCaps is each host's last readable cap, by file and host: a
	// typo in the annotation keeps it (fail closed). unread counts the
	// hosts so held at the last write.
	goodCaps map[string]units.Rate
	unread   int
}

// klogOnce sets klog's logger once per process.
var klogOnce sync.Once

// New makes a watcher; Start runs it.
func New(cfg Config) *Watcher {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Settle == 0 {
		cfg.Settle = 20 * time.Millisecond
	}
	if cfg.Retry == 0 {
		cfg.Retry = time.Second
	}
	// client-go logs through klog: into the agent's log instead. klog's
	// logger is global, read by every informer's goroutines: set once
	// (the first watcher's), never while another watcher's run.
	klogOnce.Do(func() { klog.SetSlogLogger(cfg.Log) })
	sel := fields.OneTermEqualSelector("spec.nodeName", cfg.Node).String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return cfg.Client.ListPods(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cfg.Client.WatchPods(ctx, o)
		},
	}, cfg.Client)
	w := &Watcher{cfg: cfg, kick: make(chan struct{}, 1), written: map[string][]byte{}, told: map[string]bool{}, tells: map[string]int{}}
	w.informer = cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{})
	nlw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cfg.Client.ListNamespaces(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cfg.Client.WatchNamespaces(ctx, o)
		},
	}, cfg.Client)
	w.namespaces = cache.NewSharedIndexInformerWithOptions(nlw, &corev1.Namespace{}, cache.SharedIndexInformerOptions{})
	poke := func(any) { w.poke() }
	for _, inf := range []cache.SharedIndexInformer{w.informer, w.namespaces} {
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    poke,
			UpdateFunc: func(_, n any) { poke(n) },
			DeleteFunc: poke,
		})
	}
	return w
}

// namespaceWait is how long Start waits for the namespaces to be
// listed before it writes the files without their aggregates (the
// agent may not be allowed to list them: deploy/kubernetes has the
// rule). They are written again once listed.
const namespaceWait = 3 * time.Second

func (w *Watcher) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// SetTargets sets the files to keep (those of the policy in force:
// Targets), and writes them from what the watcher knows.
func (w *Watcher) SetTargets(ts []Target) error {
	w.mu.Lock()
	w.targets = slices.Clone(ts)
	w.mu.Unlock()
	_, err := w.write()
	if err != nil {
		w.poke() // the loop retries it
	}
	return err
}

// Start lists this node's pods, writes the files, and keeps them
// current until ctx ends. It returns once the first list is in, or
// with an error if it is not within wait.
func (w *Watcher) Start(ctx context.Context, wait time.Duration) error {
	go w.informer.RunWithContext(ctx)
	go w.namespaces.RunWithContext(ctx)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), w.informer.HasSynced) {
		return fmt.Errorf("kubernetes: the pods of node %s could not be listed within %s: %w", w.cfg.Node, wait, cmpErr(wctx.Err()))
	}
	nctx, ncancel := context.WithTimeout(wctx, namespaceWait)
	defer ncancel()
	if !cache.WaitForCacheSync(nctx.Done(), w.namespaces.HasSynced) {
		w.cfg.Log.Warn("kubernetes: the namespaces are not listed yet (is the agent allowed to list and watch them?): their aggregates wait for it",
			"waited", namespaceWait.String())
	}
	if _, err := w.write(); err != nil {
		return err
	}
	go w.loop(ctx)
	return nil
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("the watch ended")
	}
	return err
}

func (w *Watcher) loop(ctx context.Context) {
	// A failed write (a full disk) is retried without waiting for the
	// next pod change, backing off from a second to half a minute.
	var retry, look time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		// What comes within Settle is written with it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.cfg.Settle):
		}
		changed, err := w.write()
		if err != nil {
			retry = min(max(2*retry, w.cfg.Retry), 30*time.Second)
			w.cfg.Log.Error("kubernetes: writing the pods files failed", "err", err.Error(), "retry_in", retry.String())
			time.AfterFunc(retry, w.poke)
			continue
		}
		retry = 0
		// A pod's veth appears as the CNI sets it up: looked for again,
		// backing off as a failed write does.
		w.mu.Lock()
		pending := w.pending
		w.mu.Unlock()
		if pending > 0 {
			look = min(max(2*look, w.cfg.Retry), 30*time.Second)
			time.AfterFunc(look, w.poke)
		} else {
			look = 0
		}
		if changed && w.cfg.Changed != nil {
			w.cfg.Changed()
		}
	}
}

// Pods lists the node's pods as the watcher knows them.
func (w *Watcher) Pods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range w.informer.GetStore().List() {
		if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName == w.cfg.Node {
			out = append(out, p)
		}
	}
	return out
}

// write renders every target from the pods known and writes those that
// changed, reporting whether any did.
func (w *Watcher) write() (changed bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pods := w.Pods()
	w.pending = 0
	// Rebuilt each write: the pods of now, never those gone.
	good := map[string]units.Rate{}
	w.unread = 0
	defer func() { w.goodCaps = good }()
	for _, t := range w.targets {
		if t.Veths {
			if err := w.writeVeths(t.File, pods, &changed); err != nil {
				return changed, err
			}
			continue
		}
		var hosts []Host
		groups := map[string]Group{}
		type nsGroup struct {
			g  Group
			ok bool
		}
		read := map[string]nsGroup{} // a namespace's annotations, read once per write
		for _, p := range pods {
			ng, seen := read[p.Namespace]
			if !seen && t.Groups != "" {
				ng.g, ng.ok = GroupOf(w.namespace(p.Namespace), t.Dir)
				read[p.Namespace] = ng
			}
			g, grouped := ng.g, ng.ok
			h, ok := HostIn(p, t.Dir, grouped)
			if !ok {
				continue
			}
			key := t.File + "\x00" + h.Name
			switch {
			case h.CapUnread:
				// Fail closed: a typo never lifts the cap to the class's ceil.
				last, had := w.goodCaps[key]
				if !had {
					last = t.PodRate
				}
				if h.Cap == 0 || last < h.Cap {
					h.Cap = last
				}
				good[key] = last
				w.unread++
			case h.Cap > 0:
				good[key] = h.Cap
			}
			hosts = append(hosts, h)
			for _, pr := range h.Problems {
				w.tell(p, "Pod", pr.String())
			}
			if grouped {
				groups[g.Name] = g
			}
		}
		for _, g := range groups {
			for _, pr := range g.Problems {
				if ns := w.namespace(g.Name); ns != nil {
					w.tell(ns, "Namespace", pr.String())
				}
			}
		}
		data, dropped := Render(hosts, t.Classes)
		for name, whys := range dropped {
			for _, p := range pods {
				if hostName(p.Namespace, p.Name) == name {
					for _, why := range whys {
						w.tell(p, "Pod", why)
					}
				}
			}
		}
		// The groups before the pods that name them (and a reload
		// between the two takes a pod of a group not yet listed as a
		// pod of the pods class: policy.PodsGroupsFile).
		type file struct {
			name string
			data []byte
		}
		var files []file
		if t.Groups != "" {
			files = append(files, file{t.Groups, RenderGroups(hosts, groups)})
		}
		files = append(files, file{t.File, data})
		for _, f := range files {
			if err := w.writeIfChanged(f.name, f.data, &changed); err != nil {
				return changed, err
			}
		}
	}
	w.lastErr = nil
	// Forget what was told of pods and namespaces that are gone (1,000
	// churning).
	live := map[string]bool{}
	for _, p := range pods {
		live[string(p.UID)] = true
	}
	for _, o := range w.namespaces.GetStore().List() {
		if ns, ok := o.(*corev1.Namespace); ok {
			live[string(ns.UID)] = true
		}
	}
	for k := range w.told {
		if uid, _, _ := strings.Cut(k, "\x00"); !live[uid] {
			delete(w.told, k)
		}
	}
	for uid := range w.tells {
		if !live[uid] {
			delete(w.tells, uid)
		}
	}
	return changed, nil
}

// writeIfChanged writes file unless it was last written with data,
// setting *changed when it does.
func (w *Watcher) writeIfChanged(file string, data []byte, changed *bool) error {
	if old, ok := w.written[file]; ok && bytes.Equal(old, data) {
		return nil
	}
	if err := writeFile(file, data); err != nil {
		w.lastErr = err
		return err
	}
	w.written[file], *changed = data, true
	w.writes++
	w.cfg.Log.Debug("kubernetes: file written", "file", file, "lines", bytes.Count(data, []byte{'\n'})-1)
	return nil
}

// writeVeths writes a pod_veths file from pods: each pod with a cap on
// the device it is routed through. A pod whose device is not found yet
// counts in w.pending (the loop looks again); one that has no device
// of its own gets an Event, as does a cap annotation that cannot be
// read.
func (w *Watcher) writeVeths(file string, pods []*corev1.Pod, changed *bool) error {
	var veths []Veth
	if w.cfg.Device != nil {
		var pending, refused map[*corev1.Pod]string
		veths, pending, refused = VethsOf(pods, w.cfg.Device)
		for p, why := range refused {
			w.warn(p, "Pod", NotOnVeth, "kubernetes: pod not shaped on a veth", why)
		}
		for _, p := range pods {
			for _, pr := range CapProblems(p) {
				w.tell(p, "Pod", pr.String())
			}
		}
		for p, why := range pending {
			w.cfg.Log.Debug("kubernetes: pod's veth not found yet", "pod", p.Namespace+"/"+p.Name, "why", why)
		}
		w.pending += len(pending)
	}
	return w.writeIfChanged(file, RenderVeths(veths), changed)
}

// writeFile replaces file with data: atomically, in a directory only
// root may write, never through a link.
func writeFile(file string, data []byte) error {
	d, err := safefile.OpenDir(filepath.Dir(file), true)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.WriteAtomic(filepath.Base(file), data)
}

// namespace is namespace name as the watcher knows it (nil: not listed).
func (w *Watcher) namespace(name string) *corev1.Namespace {
	o, ok, err := w.namespaces.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	ns, _ := o.(*corev1.Namespace)
	return ns
}

// tell reports a problem with the annotations of o (a Pod or a
// Namespace: kind) once: a log line and a Warning Event on it. A pod
// stays a host without them, a namespace an aggregate.
func (w *Watcher) tell(o metav1.Object, kind, why string) {
	w.warn(o, kind, "BadBandwidthAnnotation", "kubernetes: annotation not used", why)
}

// NotOnVeth is the reason of the Event on a pod that pod_veths cannot
// shape on a device of its own.
const NotOnVeth = "NotShapedOnVeth"

// MaxTells bounds the problems told of one object over its life: a
// tenant editing an annotation in a loop gets that many Events and log
// lines, then one saying the rest are not told (issue 58: 150 edits
// left 149 Events, 14 MB in etcd, and grew the agent).
const MaxTells = 5

// warn reports a problem with o once: a log line (msg) and a Warning
// Event with reason. What is remembered is a hash of it, per object.
func (w *Watcher) warn(o metav1.Object, kind, reason, msg, why string) {
	uid := string(o.GetUID())
	sum := sha256.Sum256([]byte(why))
	key := uid + "\x00" + hex.EncodeToString(sum[:8])
	if w.told[key] || w.tells[uid] > MaxTells {
		return
	}
	w.told[key] = true
	w.tells[uid]++
	if w.tells[uid] > MaxTells {
		why = fmt.Sprintf("more than %d problems with its annotations: the next are not told until it is made again", MaxTells)
	}
	who := o.GetName()
	if o.GetNamespace() != "" {
		who = o.GetNamespace() + "/" + who
	}
	w.cfg.Log.Warn(msg, strings.ToLower(kind), who, "why", why)
	// A namespace is cluster-scoped: its Events go in "default".
	evNS := cmp.Or(o.GetNamespace(), metav1.NamespaceDefault)
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: o.GetName() + ".sluice.", Namespace: evNS},
		InvolvedObject: corev1.ObjectReference{Kind: kind, APIVersion: "v1", Namespace: o.GetNamespace(), Name: o.GetName(),
			UID: o.GetUID(), ResourceVersion: o.GetResourceVersion()},
		Reason: reason, Message: "sluice: " + why, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "sluice-agent", Host: w.cfg.Node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	// Not under the caller's context: an Event is best effort, and a
	// slow API server must not hold the files back.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.cfg.Client.CreateEvent(ctx, ev); err != nil {
			w.cfg.Log.Debug("kubernetes: event not sent", strings.ToLower(kind), who, "err", err.Error())
		}
	}()
}

// Status is what the watcher says of itself (the agent's status).
type Status struct {
	Node   string   `json:"node"`
	Pods   int      `json:"pods"`
	Files  []string `json:"files"`
	Writes int      `json:"writes"`
	// CapsUnreadable counts the pods whose cap annotation cannot be
	// read, held at their last good cap or their class's per-pod rate.
	CapsUnreadable int    `json:"caps_unreadable"`
	Error          string `json:"error,omitempty"`
}

// Status reports the node, the pods known, the files kept and how often
// they were written.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Status{Node: w.cfg.Node, Pods: len(w.Pods()), Writes: w.writes, CapsUnreadable: w.unread}
	for _, t := range w.targets {
		s.Files = append(s.Files, t.File)
	}
	if w.lastErr != nil {
		s.Error = w.lastErr.Error()
	}
	return s
}
