package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/verify"
)

// metricFamily is what the checks need to know about a metric.
type metricFamily struct {
	typ      string // counter, gauge, histogram, summary, or "" when unknown
	labels   map[string]bool
	vector   bool // it has variable labels: absent from /metrics until observed
	external bool // exported by another program (Prometheus itself, an exporter)
}

type catalogue map[string]*metricFamily

func (c catalogue) add(name, typ string, labels []string, vector bool) {
	f := c[name]
	if f == nil {
		f = &metricFamily{labels: map[string]bool{}}
		c[name] = f
	}
	if typ != "" {
		f.typ = typ
	}
	f.vector = f.vector || vector
	for _, l := range labels {
		f.labels[l] = true
	}
}

// recorder is a prometheus.Registerer that records what registers with it:
// the metrics the code declares, vectors included (a registry only shows a
// vector once a child exists).
type recorder struct{ cat catalogue }

var _ prometheus.Registerer = (*recorder)(nil)

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

func (r *recorder) Register(c prometheus.Collector) error {
	typ := ""
	switch c.(type) {
	case prometheus.Histogram, *prometheus.HistogramVec:
		typ = "histogram"
	case prometheus.Summary, *prometheus.SummaryVec:
		typ = "summary"
	}
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("cannot read descriptor %s", d)
		}
		var labels []string
		for _, kv := range splitNonEmpty(m[2]) {
			name, _, _ := strings.Cut(kv, "=")
			labels = append(labels, name)
		}
		variable := splitNonEmpty(m[3])
		for _, v := range variable {
			labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(v, "c("), ")"))
		}
		r.cat.add(m[1], typ, labels, len(variable) > 0)
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

func splitNonEmpty(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// declaredMetrics records every metric mandated's code declares, with the
// daemon's own constructors and options.
func declaredMetrics(t testing.TB) catalogue {
	t.Helper()
	rec := &recorder{cat: catalogue{}}
	processor.NewMetrics(rec)
	outbox.NewMetrics(rec)
	verify.NewMetrics(rec) // mandatectl verify's, pushed by the CronJob
	rec.MustRegister(sink.NewPoolCollector(&sink.Sink{}))
	// The gateway registers its metrics when it is made (cmd/mandate-gateway).
	_, err := gateway.New(gateway.Config{}, nil, nil, rec)
	require.NoError(t, err)
	// kprom registers when a client is created (cmd/mandated's options).
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"),
		kgo.WithHooks(kprom.NewMetrics("mandated_kafka", kprom.Registerer(rec), kprom.WithClientLabel())))
	require.NoError(t, err)
	cl.Close()
	require.Greater(t, len(rec.cat), 40)
	return rec.cat
}

// scrapedMetrics parses a /metrics page (text exposition format).
func scrapedMetrics(t testing.TB, r io.Reader) catalogue {
	t.Helper()
	cat := catalogue{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			require.Len(t, f, 2, line)
			cat.add(f[0], f[1], nil, false)
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		var labels []string
		if strings.HasPrefix(rest, "{") {
			labels = sampleLabels(rest)
		}
		cat.add(name, "", labels, false)
	}
	require.NoError(t, sc.Err())
	return cat
}

// sampleLabels returns the label names of `{a="x",b="y\"z"} 1`.
func sampleLabels(s string) []string {
	var out []string
	i := 1
	for i < len(s) && s[i] != '}' {
		j := strings.IndexByte(s[i:], '=')
		if j < 0 {
			break
		}
		out = append(out, strings.TrimSpace(strings.TrimPrefix(s[i:i+j], ",")))
		i += j + 2 // past `="`
		for i < len(s) && s[i] != '"' {
			if s[i] == '\\' {
				i++
			}
			i++
		}
		i++ // the closing quote
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
	return out
}

// externalMetrics are the only metrics deploy/ may use that mandated does
// not export, with the labels they have.
var externalMetrics = map[string][]string{
	"up":                    {"job", "instance"},
	"probe_success":         {"job", "instance"},
	"kube_pod_status_ready": {"namespace", "pod", "uid", "condition"},
}

// targetLabels are attached by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance"}

// usage is one PromQL expression of deploy/ and where it is.
type usage struct {
	where, expr string
}

func alertExpressions(t testing.TB) []usage {
	t.Helper()
	doc := yamlDocs(t, deployPath(t, "prometheus", "alerts.yaml"))[0]
	var out []usage
	for _, g := range dig(doc, "groups").([]any) {
		for _, r := range dig(g, "rules").([]any) {
			name := str(dig(r, "alert")) + str(dig(r, "record"))
			out = append(out, usage{where: "alert " + name, expr: str(dig(r, "expr"))})
		}
	}
	require.NotEmpty(t, out)
	return out
}

var labelValuesQuery = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

func dashboardExpressions(t testing.TB) []usage {
	t.Helper()
	b, err := os.ReadFile(deployPath(t, "grafana", "mandated.json"))
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	var out []usage
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, usage{where: "panel " + p.Title, expr: tg.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := str(dig(v.Query, "query"))
		m := labelValuesQuery.FindStringSubmatch(q)
		require.NotNil(t, m, "variable %s: only label_values(metric, label) queries are checked: %q", v.Name, q)
		out = append(out, usage{where: "variable " + v.Name, expr: fmt.Sprintf("%s{%s=~\".*\"}", m[1], m[2])})
	}
	require.Greater(t, len(out), 20)
	return out
}

// resolve finds the family a series name belongs to: itself, or the
// histogram or summary it is the _bucket, _sum or _count series of.
func (c catalogue) resolve(name string) (*metricFamily, []string, bool) {
	if f, ok := c[name]; ok {
		return f, nil, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		stem, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := c[stem]; ok && (f.typ == "histogram" || f.typ == "summary") {
			var extra []string
			if suffix == "_bucket" {
				extra = []string{"le"}
			}
			return f, extra, true
		}
	}
	return nil, nil, false
}

// usageProblems checks every metric and label name the expressions use
// and returns what is wrong, and the metric names used.
func usageProblems(cat catalogue, usages []usage) (problems []string, used map[string]bool) {
	used = map[string]bool{}
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, u := range usages {
		refs := scanPromQL(u.expr)
		if len(refs.selectors) == 0 {
			bad("%s: %q selects nothing", u.where, u.expr)
		}
		available := map[string]bool{}
		for _, l := range targetLabels {
			available[l] = true
		}
		for _, sel := range refs.selectors {
			if sel.name == "" {
				bad("%s: name every metric: %q", u.where, u.expr)
				continue
			}
			f, extra, ok := cat.resolve(sel.name)
			if !ok {
				if labels, ext := externalMetrics[sel.name]; ext {
					f = &metricFamily{labels: map[string]bool{}, external: true}
					for _, l := range labels {
						f.labels[l] = true
					}
					ok = true
				}
			}
			if !ok {
				bad("%s uses %s, which mandated does not export (and is not one of the external metrics %v)",
					u.where, sel.name, sortedKeys(externalMetrics))
				continue
			}
			used[sel.name] = true
			labels := map[string]bool{}
			for l := range f.labels {
				labels[l] = true
			}
			for _, l := range append(extra, targetLabels...) {
				labels[l] = true
			}
			for _, l := range sel.labels {
				if !labels[l] {
					bad("%s: %s has no label %q (it has %v)", u.where, sel.name, l, sortedKeys(f.labels))
				}
			}
			for l := range labels {
				available[l] = true
			}
		}
		for _, l := range refs.grouping {
			if !available[l] {
				bad("%s groups by %q, which none of its metrics has: %q", u.where, l, u.expr)
			}
		}
	}
	return problems, used
}

func TestAlertAndDashboardMetricsAreDeclared(t *testing.T) {
	t.Parallel()
	cat := declaredMetrics(t)
	t.Run("the alert rules use only declared metrics and their labels", func(t *testing.T) {
		problems, _ := usageProblems(cat, alertExpressions(t))
		require.Empty(t, problems)
	})
	t.Run("the dashboard uses only declared metrics and their labels", func(t *testing.T) {
		problems, _ := usageProblems(cat, dashboardExpressions(t))
		require.Empty(t, problems)
	})
	t.Run("a misspelt metric or label is caught", func(t *testing.T) {
		for _, expr := range []string{
			`sum by (outcom) (rate(mandated_decisions_total[5m]))`,
			`rate(mandated_decisions_total{outcom="denied"}[5m])`,
			`mandated_decision_total`,
			`rate(mandated_partitions_owned_bucket[5m])`,
		} {
			problems, _ := usageProblems(cat, []usage{{"probe", expr}})
			require.NotEmpty(t, problems, expr)
		}
	})
}

func TestEveryAlertHasARunbook(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(deployPath(t, "README.md"))
	require.NoError(t, err)
	doc := yamlDocs(t, deployPath(t, "prometheus", "alerts.yaml"))[0]
	var names []string
	for _, g := range dig(doc, "groups").([]any) {
		for _, r := range dig(g, "rules").([]any) {
			name := str(dig(r, "alert"))
			names = append(names, name)
			require.Contains(t, []string{"critical", "warning", "info"}, str(dig(r, "labels", "severity")), name)
			require.NotEmpty(t, str(dig(r, "annotations", "summary")), name)
			require.NotEmpty(t, str(dig(r, "annotations", "description")), name)
			require.True(t, strings.HasSuffix(str(dig(r, "annotations", "runbook_url")), "README.md#"+strings.ToLower(name)),
				"%s: runbook_url points at its README section", name)
			require.Contains(t, string(readme), "\n### "+name+"\n", "deploy/README.md has a runbook section for %s", name)
		}
	}
	sort.Strings(names)
	// The alerts the deployment promises.
	for _, want := range []string{"MandatedInDoubtTooOld", "MandatedFencedCommits", "MandatedConsumerLagHigh",
		"MandatedOutboxBacklogHigh", "MandatedOutboxStalled", "MandatedDeadLetters", "MandatedParkedOutboxRows",
		"MandatedOutboxSequenceGap", "MandatedInstanceNotReady", "MandatedInstanceDown"} {
		require.Contains(t, names, want)
	}
}
