package corev1

import "k8s.io/apimachinery/pkg/runtime"

// Deep copies, as informers and the object tracker make them: each type
// copies its metadata with apimachinery's and its slices by value.

// DeepCopyInto copies p into out.
func (p *Pod) DeepCopyInto(out *Pod) {
	*out = *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Status.PodIPs = append([]PodIP(nil), p.Status.PodIPs...)
}

// DeepCopy is a copy of p.
func (p *Pod) DeepCopy() *Pod {
	if p == nil {
		return nil
	}
	out := new(Pod)
	p.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a copy of p (runtime.Object).
func (p *Pod) DeepCopyObject() runtime.Object { return p.DeepCopy() }

// DeepCopyObject is a copy of l (runtime.Object).
func (l *PodList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &PodList{TypeMeta: l.TypeMeta, Items: copyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

// DeepCopyInto copies n into out.
func (n *Namespace) DeepCopyInto(out *Namespace) {
	out.TypeMeta = n.TypeMeta
	n.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
}

// DeepCopyObject is a copy of n (runtime.Object).
func (n *Namespace) DeepCopyObject() runtime.Object {
	if n == nil {
		return nil
	}
	out := new(Namespace)
	n.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a copy of l (runtime.Object).
func (l *NamespaceList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &NamespaceList{TypeMeta: l.TypeMeta, Items: copyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

// DeepCopyInto copies e into out.
func (e *Event) DeepCopyInto(out *Event) {
	*out = *e
	e.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	e.FirstTimestamp.DeepCopyInto(&out.FirstTimestamp)
	e.LastTimestamp.DeepCopyInto(&out.LastTimestamp)
}

// DeepCopyObject is a copy of e (runtime.Object).
func (e *Event) DeepCopyObject() runtime.Object {
	if e == nil {
		return nil
	}
	out := new(Event)
	e.DeepCopyInto(out)
	return out
}

// DeepCopyObject is a copy of l (runtime.Object).
func (l *EventList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &EventList{TypeMeta: l.TypeMeta, Items: copyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}

// copyItems deep-copies a list's items.
func copyItems[T any, P interface {
	*T
	DeepCopyInto(*T)
}](in []T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i := range in {
		P(&in[i]).DeepCopyInto(&out[i])
	}
	return out
}
