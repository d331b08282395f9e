// Package kubetest gives tests a Kubernetes API without a server:
// client-go's fake CoreV1 over an object tracker, as the fake clientset
// builds it (pods listed, watched, created, updated and deleted; events
// recorded). It ignores field selectors. End-to-end tests of the agent
// against a real API server are issue 26's next step; this stands in
// for the server only.
package kubetest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	corefake "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	clienttesting "k8s.io/client-go/testing"
)

// Fake is the fake client: a CoreV1Interface for the tests to create,
// update and delete with, and the agent's kube.API over the same
// tracker.
type Fake struct{ *corefake.FakeCoreV1 }

// ListPods lists the pods of every namespace (kube.API).
func (f Fake) ListPods(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	return f.Pods(metav1.NamespaceAll).List(ctx, o)
}

// WatchPods watches the pods of every namespace (kube.API).
func (f Fake) WatchPods(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f.Pods(metav1.NamespaceAll).Watch(ctx, o)
}

// ListNamespaces lists the namespaces (kube.API).
func (f Fake) ListNamespaces(ctx context.Context, o metav1.ListOptions) (*corev1.NamespaceList, error) {
	return f.Namespaces().List(ctx, o)
}

// WatchNamespaces watches the namespaces (kube.API).
func (f Fake) WatchNamespaces(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return f.Namespaces().Watch(ctx, o)
}

// CreateEvent records ev in its namespace (kube.API).
func (f Fake) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	_, err := f.Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// IsWatchListSemanticsUnSupported tells client-go's reflector to list
// and then watch: the tracker cannot stream a list (as the fake
// clientset says of itself).
func (Fake) IsWatchListSemanticsUnSupported() bool { return true }

// Client is a fake CoreV1 client holding objs.
func Client(objs ...runtime.Object) Fake {
	tr := clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())
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
	return Fake{&corefake.FakeCoreV1{Fake: f}}
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
