package corev1_test

import (
	"encoding/json"
	"testing"

	real "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"sluice/kube/corev1"
)

// A pod as an API server sends it, with everything k8s.io/api's full
// type carries, decodes through the client's codec into these types:
// what the agent reads arrives, the rest is skipped.
func TestDecodesWhatTheServerSends(t *testing.T) {
	now := metav1.Now()
	full := &real.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u1", ResourceVersion: "42",
			Annotations: map[string]string{"kubernetes.io/egress-bandwidth": "10M"}, Labels: map[string]string{"app": "web"},
			DeletionTimestamp: &now},
		Spec: real.PodSpec{NodeName: "node-a", HostNetwork: true,
			Containers: []real.Container{{Name: "c", Image: "nginx", Ports: []real.ContainerPort{{ContainerPort: 80}}}}},
		Status: real.PodStatus{Phase: real.PodFailed, PodIP: "10.1.0.2",
			PodIPs: []real.PodIP{{IP: "10.1.0.2"}, {IP: "fd00::2"}}, HostIP: "192.0.2.1"},
	}
	b, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := serializer.NewCodecFactory(corev1.NewScheme()).UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		t.Fatalf("decoded a %T", obj)
	}
	if p.Namespace != "shop" || p.Name != "web" || p.UID != "u1" || p.ResourceVersion != "42" ||
		p.Annotations["kubernetes.io/egress-bandwidth"] != "10M" || p.DeletionTimestamp == nil ||
		p.Spec.NodeName != "node-a" || !p.Spec.HostNetwork || p.Status.Phase != corev1.PodFailed ||
		p.Status.PodIP != "10.1.0.2" || len(p.Status.PodIPs) != 2 || p.Status.PodIPs[1].IP != "fd00::2" {
		t.Errorf("decoded %+v", p)
	}
	// A deep copy shares nothing a caller may change.
	c := p.DeepCopyObject().(*corev1.Pod)
	c.Annotations["x"] = "y"
	c.Status.PodIPs[0].IP = "10.9.9.9"
	if p.Annotations["x"] != "" || p.Status.PodIPs[0].IP != "10.1.0.2" {
		t.Errorf("the copy shares its maps or slices: %+v", p)
	}
}

// An Event the agent writes is, to k8s.io/api's full type, the same
// Event: every field it sets under the same JSON name.
func TestEventIsCoreV1s(t *testing.T) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "web.sluice.", Namespace: "shop"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "shop", Name: "web",
			UID: "u1", ResourceVersion: "42"},
		Reason: "BadAnnotation", Message: "sluice: why", Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "sluice-agent", Host: "node-a"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var got real.Event
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := real.Event{
		ObjectMeta: ev.ObjectMeta,
		InvolvedObject: real.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "shop", Name: "web",
			UID: "u1", ResourceVersion: "42"},
		Reason: "BadAnnotation", Message: "sluice: why", Type: real.EventTypeWarning,
		Source:         real.EventSource{Component: "sluice-agent", Host: "node-a"},
		FirstTimestamp: got.FirstTimestamp, LastTimestamp: got.LastTimestamp, Count: 1,
	}
	wb, _ := json.Marshal(want)
	gb, _ := json.Marshal(got)
	if string(wb) != string(gb) || got.FirstTimestamp.Unix() != now.Unix() || got.LastTimestamp.Unix() != now.Unix() {
		t.Errorf("as k8s.io/api reads it:\n%s\nwant\n%s", gb, wb)
	}
}
