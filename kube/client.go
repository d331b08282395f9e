package kube

import (
	"errors"
	"fmt"
	"os"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client reaches the API server with kubeconfig, or from inside the
// cluster (the pod's service account) where kubeconfig is "".
func Client(kubeconfig string) (corev1client.CoreV1Interface, error) {
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
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return c, nil
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
