// Package kubetest gives tests a Kubernetes API without a server:
// client-go's fake action machinery over an object tracker, as the
// fake clientset builds it (pods and namespaces listed, watched,
// created, updated and deleted; events recorded), in sluice's own
// core/v1 types (package kube/corev1). It ignores field selectors.
// End-to-end tests of the agent against a real API server use a real
// one (e2e, make test-kubernetes).
package kubetest

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"

	"sluice/kube/corev1"
)

var (
	scheme     = corev1.NewScheme()
	gv         = corev1.SchemeGroupVersion
	podsR      = gv.WithResource("pods")
	podsK      = gv.WithKind("Pod")
	namespaceR = gv.WithResource("namespaces")
	namespaceK = gv.WithKind("Namespace")
	eventsR    = gv.WithResource("events")
	eventsK    = gv.WithKind("Event")
)

// Fake is the fake client: typed calls for the tests to create, update
// and delete with (Pods, Namespaces, Events, as client-go's CoreV1
// names them), and the agent's kube.API, over the same tracker. Its
// embedded Fake takes reactors, to inject faults.
type Fake struct{ *clienttesting.Fake }

// ListPods lists the pods of every namespace (kube.API).
func (f Fake) ListPods(_ context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	obj, err := f.Invokes(clienttesting.NewListActionWithOptions(podsR, podsK, metav1.NamespaceAll, o), &corev1.PodList{})
	l, _ := obj.(*corev1.PodList)
	return l, err
}

// WatchPods watches the pods of every namespace (kube.API).
func (f Fake) WatchPods(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f.InvokesWatch(clienttesting.NewWatchActionWithOptions(podsR, metav1.NamespaceAll, o))
}

// ListNamespaces lists the namespaces (kube.API).
func (f Fake) ListNamespaces(_ context.Context, o metav1.ListOptions) (*corev1.NamespaceList, error) {
	obj, err := f.Invokes(clienttesting.NewRootListActionWithOptions(namespaceR, namespaceK, o), &corev1.NamespaceList{})
	l, _ := obj.(*corev1.NamespaceList)
	return l, err
}

// WatchNamespaces watches the namespaces (kube.API).
func (f Fake) WatchNamespaces(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f.InvokesWatch(clienttesting.NewRootWatchActionWithOptions(namespaceR, o))
}

// CreateEvent records ev in its namespace (kube.API).
func (f Fake) CreateEvent(_ context.Context, ev *corev1.Event) error {
	_, err := f.Invokes(clienttesting.NewCreateAction(eventsR, ev.Namespace, ev), &corev1.Event{})
	return err
}

// IsWatchListSemanticsUnSupported tells client-go's reflector to list
// and then watch: the tracker cannot stream a list (as the fake
// clientset says of itself).
func (Fake) IsWatchListSemanticsUnSupported() bool { return true }

// Pods is the pods of namespace ns, for a test to change.
func (f Fake) Pods(ns string) Pods { return Pods{f, ns} }

// Namespaces is the namespaces, for a test to change.
func (f Fake) Namespaces() Namespaces { return Namespaces{f} }

// Events is the Events of namespace ns, for a test to read.
func (f Fake) Events(ns string) Events { return Events{f, ns} }

// Pods are one namespace's pods.
type Pods struct {
	f  Fake
	ns string
}

// Get is pod name.
func (p Pods) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Pod, error) {
	obj, err := p.f.Invokes(clienttesting.NewGetAction(podsR, p.ns, name), &corev1.Pod{})
	pod, _ := obj.(*corev1.Pod)
	return pod, err
}

// Create adds pod.
func (p Pods) Create(_ context.Context, pod *corev1.Pod, _ metav1.CreateOptions) (*corev1.Pod, error) {
	obj, err := p.f.Invokes(clienttesting.NewCreateAction(podsR, p.ns, pod), &corev1.Pod{})
	out, _ := obj.(*corev1.Pod)
	return out, err
}

// Update replaces pod.
func (p Pods) Update(_ context.Context, pod *corev1.Pod, _ metav1.UpdateOptions) (*corev1.Pod, error) {
	obj, err := p.f.Invokes(clienttesting.NewUpdateAction(podsR, p.ns, pod), &corev1.Pod{})
	out, _ := obj.(*corev1.Pod)
	return out, err
}

// Delete removes pod name.
func (p Pods) Delete(_ context.Context, name string, _ metav1.DeleteOptions) error {
	_, err := p.f.Invokes(clienttesting.NewDeleteAction(podsR, p.ns, name), &corev1.Pod{})
	return err
}

// Namespaces are the cluster's namespaces.
type Namespaces struct{ f Fake }

// Get is namespace name.
func (n Namespaces) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Namespace, error) {
	obj, err := n.f.Invokes(clienttesting.NewRootGetAction(namespaceR, name), &corev1.Namespace{})
	ns, _ := obj.(*corev1.Namespace)
	return ns, err
}

// Update replaces ns.
func (n Namespaces) Update(_ context.Context, ns *corev1.Namespace, _ metav1.UpdateOptions) (*corev1.Namespace, error) {
	obj, err := n.f.Invokes(clienttesting.NewRootUpdateAction(namespaceR, ns), &corev1.Namespace{})
	out, _ := obj.(*corev1.Namespace)
	return out, err
}

// Events are one namespace's Events.
type Events struct {
	f  Fake
	ns string
}

// List is the namespace's Events.
func (e Events) List(_ context.Context, o metav1.ListOptions) (*corev1.EventList, error) {
	obj, err := e.f.Invokes(clienttesting.NewListActionWithOptions(eventsR, eventsK, e.ns, o), &corev1.EventList{})
	l, _ := obj.(*corev1.EventList)
	return l, err
}

// Client is a fake client holding objs.
func Client(objs ...runtime.Object) Fake {
	tr := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	for _, o := range objs {
		if err := tr.Add(o); err != nil {
			panic(err)
		}
	}
	f := &clienttesting.Fake{}
	f.AddReactor("*", "*", clienttesting.ObjectReaction(tr))
	f.AddWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := tr.Watch(a.GetResource(), a.GetNamespace(), opts)
		return err == nil, w, err
	})
	return Fake{f}
}

// Pod is a running pod ns/name on node with annotations ann and
// addresses ips (its status.podIPs; the first is its podIP too).
func Pod(ns, name, node string, ann map[string]string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann, UID: types.UID(ns + "/" + name)},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

// Namespace is namespace name with annotations ann.
func Namespace(name string, ann map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann, UID: types.UID("ns/" + name)}}
}
