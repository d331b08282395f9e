package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"sluice/kube/corev1"
)

// API is what the watcher asks of the API server: this node's pods and
// the namespaces, listed and watched, and Events created. Client is the
// real one; kubetest's fake stands in for it in tests.
type API interface {
	ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*corev1.NamespaceList, error)
	WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	CreateEvent(ctx context.Context, ev *corev1.Event) error
}

// coreScheme knows core/v1 and no other API group, in sluice's own
// types (package corev1). client-go's typed clients register every
// group the server may serve (its kubernetes/scheme: about 8 MB of the
// binary, issue 61), and k8s.io/api's core/v1 was 3.6 MB more; the agent
// reads pods and namespaces and writes Events.
var (
	coreScheme = corev1.NewScheme()
	coreParams = runtime.NewParameterCodec(coreScheme)
)

// restAPI is API over a REST client for core/v1, as client-go's typed
// CoreV1 client issues the same requests (gentype's List, Watch and
// Create).
type restAPI struct{ c rest.Interface }

// Client reaches the API server with kubeconfig, or from inside the
// cluster (the pod's service account) where kubeconfig is "".
func Client(kubeconfig string) (API, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			err = errors.New("not in a cluster (no KUBERNETES_SERVICE_HOST): give --kubeconfig")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	cfg.UserAgent = "sluice-agent"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(coreScheme).WithoutConversion()
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return restAPI{c}, nil
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds != nil {
		return time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return 0
}

func (a restAPI) list(ctx context.Context, resource string, opts metav1.ListOptions, into runtime.Object) error {
	return a.c.Get().Resource(resource).VersionedParams(&opts, coreParams).Timeout(timeout(opts)).Do(ctx).Into(into)
}

func (a restAPI) watch(ctx context.Context, resource string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return a.c.Get().Resource(resource).VersionedParams(&opts, coreParams).Timeout(timeout(opts)).Watch(ctx)
}

func (a restAPI) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	l := &corev1.PodList{}
	return l, a.list(ctx, "pods", opts, l)
}

func (a restAPI) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return a.watch(ctx, "pods", opts)
}

func (a restAPI) ListNamespaces(ctx context.Context, opts metav1.ListOptions) (*corev1.NamespaceList, error) {
	l := &corev1.NamespaceList{}
	return l, a.list(ctx, "namespaces", opts, l)
}

func (a restAPI) WatchNamespaces(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return a.watch(ctx, "namespaces", opts)
}

func (a restAPI) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	return a.c.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
}

// NodeName is the node the agent shapes: name if given (--node), else
// $NODE_NAME (the DaemonSet sets it from spec.nodeName), else the host
// name.
func NodeName(name string) (string, error) {
	if name != "" {
		return name, nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	n, err := os.Hostname()
	if err != nil || n == "" {
		return "", fmt.Errorf("kubernetes: no node name: give --node (%v)", err)
	}
	return n, nil
}
