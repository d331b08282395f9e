package tc

// AsDumped turns objects as sluice sends them into what a kernel dump
// returns for them: a class's bursts as transmission times, a u32 node
// marked terminal, fq_codel's times in the kernel's units. Diffing a
// plan against another's AsDumped is a dry run of a change (tests, and
// golden plans of one policy edited into another).
func AsDumped(objs []Object) []Object {
	var out []Object
	for _, o := range objs {
		switch x := o.(type) {
		case *Class:
			c := *x
			c.BufferTicks, c.CbufferTicks = XmitTicks(c.Rate, c.Burst), XmitTicks(c.Ceil, c.Cburst)
			out = append(out, &c)
		case *Filter:
			f := *x
			if f.U32 != nil && f.U32.ClassID != 0 && f.U32.Sel != nil {
				u := *f.U32
				s := *u.Sel
				s.Flags |= SelTerminal // as dumped
				u.Sel = &s
				f.U32 = &u
			}
			out = append(out, &f)
		case *Qdisc:
			q := *x
			if q.FqCodel != nil {
				f := *q.FqCodel
				f.Target, f.Interval = CodelReadBack(f.Target), CodelReadBack(f.Interval)
				q.FqCodel = &f
			}
			out = append(out, &q)
		default:
			out = append(out, o)
		}
	}
	return out
}
