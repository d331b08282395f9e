package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"
)

// knownMetrics lists every metric name the agent can export, with its
// labels (histograms with their _bucket, _sum and _count series), and
// the deprecated names apart.
func knownMetrics(t *testing.T) (known map[string]map[string]bool, deprecated map[string]bool) {
	a := fakeAgent(3, true)
	known, deprecated = map[string]map[string]bool{}, map[string]bool{}
	add := func(name string, labels []string, histogram bool) {
		names := []string{name}
		if histogram {
			names = append(names, name+"_bucket", name+"_sum", name+"_count")
		}
		for _, n := range names {
			known[n] = map[string]bool{"instance": true, "job": true}
			for _, l := range labels {
				known[n][l] = true
			}
			if strings.HasSuffix(n, "_bucket") {
				known[n]["le"] = true
			}
		}
	}
	fams, err := a.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		add(f.GetName(), labels, f.GetType() == dto.MetricType_HISTOGRAM)
	}
	descs := make(chan *prometheus.Desc, 100)
	a.metrics.Describe(descs)
	close(descs)
	re := regexp.MustCompile(`fqName: "([^"]+)", help: "([^"]*)".*variableLabels: \{([^}]*)\}`)
	for d := range descs {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		// The EDT delay is the one class metric sent as a histogram.
		add(m[1], strings.Split(m[3], ","), m[1] == "sluice_edt_delay_seconds")
		if strings.HasPrefix(m[2], "Deprecated") {
			deprecated[m[1]] = true
		}
	}
	if len(known) < 20 || len(deprecated) == 0 {
		t.Fatalf("only %d metrics known, %d deprecated", len(known), len(deprecated))
	}
	return known, deprecated
}

var (
	metricRe  = regexp.MustCompile(`\bsluice_[a-z_]+\b`)
	matcherRe = regexp.MustCompile(`(sluice_[a-z_]+)\{([^}]*)\}`)
	labelRe   = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	byRe      = regexp.MustCompile(`\bby \(([^)]*)\)`)
)

// checkExpr fails for a metric the agent does not export, a deprecated
// one, a label a metric does not carry, or a by-clause label none of the
// expression's metrics carries.
func checkExpr(t *testing.T, where, expr string, known map[string]map[string]bool, deprecated map[string]bool) {
	t.Helper()
	names := metricRe.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: %q reads no sluice metric", where, expr)
	}
	for _, n := range names {
		switch {
		case known[n] == nil:
			t.Errorf("%s: %s is not a metric the agent exports", where, n)
		case deprecated[n]:
			t.Errorf("%s: %s is deprecated", where, n)
		}
	}
	for _, m := range matcherRe.FindAllStringSubmatch(expr, -1) {
		for _, l := range labelRe.FindAllStringSubmatch(m[2], -1) {
			if known[m[1]] != nil && !known[m[1]][l[1]] && l[1] != "host" {
				t.Errorf("%s: %s has no label %s", where, m[1], l[1])
			}
		}
	}
	for _, m := range byRe.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			l = strings.TrimSpace(l)
			ok := false
			for _, n := range names {
				ok = ok || known[n][l]
			}
			if !ok {
				t.Errorf("%s: by (%s): no metric of %q carries %s", where, m[1], expr, l)
			}
		}
	}
}

// The Grafana dashboard in deploy/ reads only metrics and labels the
// agent exports, and is a dashboard Grafana lays out: unique panel ids,
// panels within its 24 columns, a query per target, variables defined.
func TestGrafanaDashboard(t *testing.T) {
	known, deprecated := knownMetrics(t)
	b, err := os.ReadFile("../deploy/grafana/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID, Title    string
		SchemaVersion int
		Templating    struct {
			List []struct{ Name, Type, Query string }
		}
		Panels []struct {
			ID                       int
			Title, Type, Description string
			GridPos                  struct{ X, Y, W, H int }
			Datasource               struct{ Type, UID string }
			Targets                  []struct{ RefID, Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 || len(d.Panels) < 8 {
		t.Fatalf("dashboard uid %q title %q schema %d, %d panels", d.UID, d.Title, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "query" {
			checkExpr(t, "variable "+v.Name, v.Query, known, deprecated)
		}
	}
	ids := map[int]bool{}
	types := map[string]bool{"timeseries": true, "stat": true, "bargauge": true, "table": true, "gauge": true}
	for _, p := range d.Panels {
		where := "panel " + p.Title
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("%s: id %d missing or repeated", where, p.ID)
		}
		ids[p.ID] = true
		if !types[p.Type] || p.Description == "" || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: type %q, description %q, datasource %q", where, p.Type, p.Description, p.Datasource.UID)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: grid %+v outside 24 columns", where, g)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		for _, q := range p.Targets {
			checkExpr(t, where, q.Expr, known, deprecated)
			for _, v := range regexp.MustCompile(`\$([a-z_]+)`).FindAllStringSubmatch(q.Expr, -1) {
				if !vars[v[1]] && !strings.HasPrefix(v[1], "__") {
					t.Errorf("%s: $%s is no variable of the dashboard", where, v[1])
				}
			}
		}
	}
}

// The alerting rules in deploy/ read only metrics and labels the agent
// exports, and each says how bad it is and what it means.
func TestAlertRules(t *testing.T) {
	known, deprecated := knownMetrics(t)
	b, err := os.ReadFile("../deploy/prometheus/sluice-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			where := "alert " + r.Alert
			if r.Alert == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a name, a summary and a description: %+v", where, r)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", where, s)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", where, r.For, err)
				}
			}
			checkExpr(t, where, r.Expr, known, deprecated)
		}
	}
	if n < 5 {
		t.Fatalf("%d rules", n)
	}
}
