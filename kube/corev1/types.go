// Package corev1 is the part of Kubernetes' core/v1 API the agent reads
// and writes: pods (their node, addresses, phase and annotations),
// namespaces and Events, with the field names and JSON of
// k8s.io/api/core/v1 and nothing else. That package holds every core
// type with its protobuf and deep-copy code, about 3.6 MB of a static
// binary for the few fields used here (issue 61). The JSON decoder
// skips what these types leave out, so a pod from any API server
// version decodes.
package corev1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// SchemeGroupVersion is core/v1: the empty group, version v1.
var SchemeGroupVersion = schema.GroupVersion{Group: "", Version: "v1"}

// NewScheme is a scheme of these types alone: what a client of core/v1
// (kube.Client, kubetest's tracker) decodes with.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		panic(err) // AddToScheme cannot fail
	}
	return s
}

// AddToScheme registers these types as core/v1's, with the meta types
// (ListOptions, Status, WatchEvent) a client needs beside them.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &Pod{}, &PodList{}, &Namespace{}, &NamespaceList{}, &Event{}, &EventList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// PodPhase is a pod's status.phase.
type PodPhase string

// The phases the agent tells apart.
const (
	PodPending   PodPhase = "Pending"
	PodRunning   PodPhase = "Running"
	PodSucceeded PodPhase = "Succeeded"
	PodFailed    PodPhase = "Failed"
)

// EventTypeWarning is the type of the Events the agent writes.
const EventTypeWarning = "Warning"

// Pod is a pod as the agent sees it.
type Pod struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodSpec   `json:"spec,omitempty"`
	Status            PodStatus `json:"status,omitempty"`
}

// PodSpec is the part of a pod's spec the agent reads.
type PodSpec struct {
	NodeName    string `json:"nodeName,omitempty"`
	HostNetwork bool   `json:"hostNetwork,omitempty"`
}

// PodStatus is the part of a pod's status the agent reads.
type PodStatus struct {
	Phase  PodPhase `json:"phase,omitempty"`
	PodIP  string   `json:"podIP,omitempty"`
	PodIPs []PodIP  `json:"podIPs,omitempty"`
}

// PodIP is one of a pod's addresses.
type PodIP struct {
	IP string `json:"ip,omitempty"`
}

// PodList is a list of pods.
type PodList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pod `json:"items"`
}

// Namespace is a namespace: its name and annotations are what the agent
// reads.
type Namespace struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

// NamespaceList is a list of namespaces.
type NamespaceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Namespace `json:"items"`
}

// Event is a core/v1 Event, as the agent writes them about objects it
// refuses.
type Event struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	InvolvedObject    ObjectReference `json:"involvedObject"`
	Reason            string          `json:"reason,omitempty"`
	Message           string          `json:"message,omitempty"`
	Source            EventSource     `json:"source,omitempty"`
	FirstTimestamp    metav1.Time     `json:"firstTimestamp,omitempty"`
	LastTimestamp     metav1.Time     `json:"lastTimestamp,omitempty"`
	Count             int32           `json:"count,omitempty"`
	Type              string          `json:"type,omitempty"`
}

// EventList is a list of Events.
type EventList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []Event `json:"items"`
}

// ObjectReference names the object an Event is about.
type ObjectReference struct {
	Kind            string    `json:"kind,omitempty"`
	Namespace       string    `json:"namespace,omitempty"`
	Name            string    `json:"name,omitempty"`
	UID             types.UID `json:"uid,omitempty"`
	APIVersion      string    `json:"apiVersion,omitempty"`
	ResourceVersion string    `json:"resourceVersion,omitempty"`
}

// EventSource says who wrote an Event.
type EventSource struct {
	Component string `json:"component,omitempty"`
	Host      string `json:"host,omitempty"`
}
