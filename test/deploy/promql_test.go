package deploy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// promRefs is what a PromQL expression refers to: series selectors (a
// metric name and the label names its matchers use) and the label names of
// its by/without/on/ignoring/group_left/group_right clauses.
type promRefs struct {
	selectors []promSelector
	grouping  []string
}

type promSelector struct {
	name   string
	labels []string
}

var promKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true, "atan2": true,
}

var promGroupings = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// scanPromQL is a small PromQL scanner: enough to list the metric names
// and label names an expression uses, without a dependency on Prometheus.
// Strings, range and subquery brackets and numbers are skipped; an
// identifier followed by "(" is a function; keywords are not metrics.
func scanPromQL(s string) promRefs {
	var refs promRefs
	i := 0
	skipSpace := func(j int) int {
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
			j++
		}
		return j
	}
	skipString := func(j int) int { // s[j] is the opening quote
		q := s[j]
		j++
		for j < len(s) && s[j] != q {
			if s[j] == '\\' && q != '`' {
				j++
			}
			j++
		}
		return j + 1
	}
	ident := func(j int) (string, int) {
		k := j
		for k < len(s) && isIdent(s[k]) {
			k++
		}
		return s[j:k], k
	}
	// matchers parses {name op "value", ...} from the "{" at j.
	matchers := func(j int) ([]string, int) {
		var labels []string
		j++
		for j < len(s) && s[j] != '}' {
			j = skipSpace(j)
			if j < len(s) && isIdentStart(s[j]) {
				var name string
				name, j = ident(j)
				labels = append(labels, name)
				continue
			}
			if j < len(s) && (s[j] == '"' || s[j] == '\'' || s[j] == '`') {
				j = skipString(j)
				continue
			}
			j++
		}
		return labels, j + 1
	}
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(i)
		case c == '[':
			for i < len(s) && s[i] != ']' {
				i++
			}
			i++
		case c == '{':
			labels, j := matchers(i)
			refs.selectors = append(refs.selectors, promSelector{labels: labels})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			name, j := ident(i)
			k := skipSpace(j)
			switch {
			case promGroupings[name] && k < len(s) && s[k] == '(':
				k++
				for k < len(s) && s[k] != ')' {
					if isIdentStart(s[k]) {
						var l string
						l, k = ident(k)
						refs.grouping = append(refs.grouping, l)
						continue
					}
					k++
				}
				i = k + 1
			case k < len(s) && s[k] == '(': // a function or an aggregation
				i = k
			case promKeywords[name] || promGroupings[name]:
				i = j
			default:
				sel := promSelector{name: name}
				i = j
				if k < len(s) && s[k] == '{' {
					sel.labels, i = matchers(k)
				}
				refs.selectors = append(refs.selectors, sel)
			}
		default:
			i++
		}
	}
	return refs
}

func TestScanPromQL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		expr      string
		selectors []promSelector
		grouping  []string
	}{
		{"a bare comparison names one metric", `up{job="mandated"} == 0`,
			[]promSelector{{"up", []string{"job"}}}, nil},
		{"functions, aggregations, ranges and numbers are not metrics",
			`histogram_quantile(0.99, sum by (le) (rate(mandated_batch_commit_seconds_bucket{instance=~"$instance"}[$__rate_interval]))) > 1e3`,
			[]promSelector{{"mandated_batch_commit_seconds_bucket", []string{"instance"}}}, []string{"le"}},
		{"strings may hold braces, commas and escaped quotes",
			`sum without (instance) (x_total{a="{,}", b=~"q\"uo,te", c!="z"}) or on() vector(0)`,
			[]promSelector{{"x_total", []string{"a", "b", "c"}}}, []string{"instance"}},
		{"binary operators join two selectors",
			`max by (instance) (a_connections / b_connections) > 0.9 and c unless d offset 5m`,
			[]promSelector{{"a_connections", nil}, {"b_connections", nil}, {"c", nil}, {"d", nil}}, []string{"instance"}},
		{"a selector without a name still shows its labels", `{__name__="up", job="x"}`,
			[]promSelector{{"", []string{"__name__", "job"}}}, nil},
	}
	for _, c := range cases {
		refs := scanPromQL(c.expr)
		require.Equal(t, c.selectors, refs.selectors, c.name)
		require.Equal(t, c.grouping, refs.grouping, c.name)
	}
}
