// Package kube makes a Kubernetes node's pods the hosts of a policy's
// pods classes (per_host: {pods: egress|ingress}; docs/kubernetes.md).
//
// It owns the watch of the node's pods (a client-go informer with a
// field selector on spec.nodeName), the reading of their bandwidth
// annotations (Kubernetes', Calico's, kube-ovn's and sluice's own), and
// the pods files: one hosts_file per pods class, rewritten atomically
// when what it lists changes. The agent takes a pods file as any
// hosts_file edit, through its engine session.
//
// It must not touch the kernel, and must not drop a pod or refuse a
// policy over one pod's annotation: an annotation it cannot use is a
// log line and a Warning Event on the pod, and the pod stays a host
// without it.
package kube
