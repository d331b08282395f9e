package migrate

import (
	"fmt"
	"regexp"
	"strconv"

	"sluice/policy"
)

var tcID = regexp.MustCompile(`^([0-9a-fA-F]{1,4}):([0-9a-fA-F]{1,4})$`)

// keepIDs keeps each class's old id (its Origin, "1:20") as its classid
// where sluice's tree can hold it, so that monitoring keyed on the old
// ids keeps working; the ids that cannot be kept are reported, each
// with why. Origins that are not tc ids (LibreQoS's "node Hilltop") are
// names, not ids, and stay comments.
func (d *Draft) keepIDs() {
	for _, ifc := range d.Interfaces {
		for _, t := range []*Tree{ifc.Egress, ifc.Ingress} {
			if t == nil {
				continue
			}
			taken := map[uint64]string{}
			var walk func(cs []*Class)
			walk = func(cs []*Class) {
				for _, c := range cs {
					walk(c.Classes)
					m := tcID.FindStringSubmatch(c.Origin)
					if m == nil {
						continue
					}
					major, _ := strconv.ParseUint(m[1], 16, 16)
					minor, _ := strconv.ParseUint(m[2], 16, 16)
					var why string
					switch {
					case minor < policy.MinClassID || minor > policy.MaxClassID:
						why = fmt.Sprintf("sluice's classes are 1:%x to 1:%x (1:1 is the tree's own)", policy.MinClassID, policy.MaxClassID)
					case taken[minor] != "":
						why = "class " + taken[minor] + " has it"
					}
					if why != "" {
						d.Report.Approx(c.At, "class "+c.Name+" id "+c.Origin, "not kept (%s): sluice numbers the class (plan --tc shows its id)", why)
						continue
					}
					taken[minor] = c.Name
					c.ClassID = fmt.Sprintf("1:%x", minor)
					if major != 1 {
						d.Report.Approx(c.At, "class "+c.Name+" id "+c.Origin, "becomes %s: its minor kept, on sluice's tree, whose handle is 1:", c.ClassID)
					}
				}
			}
			walk(t.Classes)
		}
	}
}
