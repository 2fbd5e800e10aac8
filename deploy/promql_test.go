package deploy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// selector is one metric a PromQL expression selects, with the label
// names its matchers use.
type selector struct {
	metric string
	labels []string
}

// promAggregators take a by/without clause between their name and their
// parentheses, so a name not followed by "(" is not always a metric.
var promAggregators = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio"}

// promKeywords are words of the language that are not metrics; those that
// take a list of label names in parentheses are in promLabelLists.
var (
	promKeywords   = []string{"and", "or", "unless", "bool", "offset", "atan2"}
	promLabelLists = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
)

// promSelectors checks the brackets and strings of a PromQL expression (no
// PromQL parser is a dependency of berth: the Prometheus module is too
// heavy for a test) and returns the metrics it selects. Words followed by
// "(" are functions, words inside {} are label matchers, inside [] range
// and subquery durations; $words are Grafana variables.
func promSelectors(expr string) ([]selector, error) {
	var (
		out   []selector
		stack []byte
	)
	isWord := func(c byte, first bool) bool {
		return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
	}
	skipSpace := func(i int) int {
		for i < len(expr) && strings.IndexByte(" \t\n\r", expr[i]) >= 0 {
			i++
		}
		return i
	}
	word := func(i int) int {
		for i < len(expr) && isWord(expr[i], false) {
			i++
		}
		return i
	}
	// matchers reads the label names of {...} at i; it returns the index
	// after the closing brace.
	matchers := func(i int) ([]string, int, error) {
		var names []string
		for i++; ; {
			i = skipSpace(i)
			switch {
			case i >= len(expr):
				return nil, i, fmt.Errorf("unclosed { in %q", expr)
			case expr[i] == '}':
				return names, i + 1, nil
			case expr[i] == ',':
				i++
			case isWord(expr[i], true):
				end := word(i)
				names = append(names, expr[i:end])
				i = skipSpace(end)
				op := 0
				for i+op < len(expr) && strings.IndexByte("=!~", expr[i+op]) >= 0 {
					op++
				}
				if op == 0 {
					return nil, i, fmt.Errorf("label %s without an operator in %q", names[len(names)-1], expr)
				}
				i = skipSpace(i + op)
				if i >= len(expr) || expr[i] != '"' && expr[i] != '\'' && expr[i] != '`' {
					return nil, i, fmt.Errorf("label %s without a quoted value in %q", names[len(names)-1], expr)
				}
				end, err := skipString(expr, i)
				if err != nil {
					return nil, i, err
				}
				i = end
			default:
				return nil, i, fmt.Errorf("unexpected %q in the matchers of %q", expr[i], expr)
			}
		}
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '(' || c == '[':
			stack = append(stack, c)
			i++
			if c == '[' {
				// A range or subquery: durations and Grafana variables only.
				end := strings.IndexByte(expr[i:], ']')
				if end < 0 {
					return nil, fmt.Errorf("unclosed [ in %q", expr)
				}
				i += end
			}
		case c == ')' || c == ']':
			open := map[byte]byte{')': '(', ']': '['}[c]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return nil, fmt.Errorf("unbalanced %q at %d in %q", c, i, expr)
			}
			stack = stack[:len(stack)-1]
			i++
		case c == '{':
			// A selector by matchers alone, {__name__=~...}, names no metric
			// this check can see: berth's rules and panels do not use one.
			return nil, fmt.Errorf("a selector without a metric name in %q", expr)
		case c == '}':
			return nil, fmt.Errorf("unbalanced } at %d in %q", i, expr)
		case c == '$':
			i = word(i + 1)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isWord(expr[i], false) || expr[i] == '.') {
				i++
			}
		case isWord(c, true):
			end := word(i)
			name := expr[i:end]
			next := skipSpace(end)
			switch {
			case slices.Contains(promLabelLists, name):
				if next >= len(expr) || expr[next] != '(' {
					return nil, fmt.Errorf("%s without a label list in %q", name, expr)
				}
				closing := strings.IndexByte(expr[next:], ')')
				if closing < 0 {
					return nil, fmt.Errorf("unclosed label list of %s in %q", name, expr)
				}
				i = next + closing + 1
				continue
			case slices.Contains(promKeywords, name) || slices.Contains(promAggregators, name):
			case next < len(expr) && expr[next] == '(':
				// a function
			default:
				sel := selector{metric: name}
				if next < len(expr) && expr[next] == '{' {
					names, after, err := matchers(next)
					if err != nil {
						return nil, err
					}
					sel.labels, end = names, after
				}
				out = append(out, sel)
			}
			i = end
		default:
			i++
		}
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("unclosed %q in %q", stack, expr)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no metric in %q", expr)
	}
	return out, nil
}

// skipString returns the index after the string literal that starts at i.
func skipString(s string, i int) (int, error) {
	quote := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && quote != '`':
			j++
		case s[j] == quote:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string in %q", s)
}

// TestPromSelectors: the check finds the metrics of the shapes berth's
// rules and panels use, and refuses unbalanced brackets and strings.
func TestPromSelectors(t *testing.T) {
	for expr, want := range map[string][]selector{
		`sum by (node, instance) (increase(berth_heal_volumes_total{result="failed"}[10m])) > 0`: {
			{"berth_heal_volumes_total", []string{"result"}}},
		`count_over_time((sum by (node) (increase(a_total{x!~"y|z"}[5m])) > 0)[1h:5m]) >= 3 or absent(up{job="j", namespace="n"} == 1)`: {
			{"a_total", []string{"x"}}, {"up", []string{"job", "namespace"}}},
		`histogram_quantile(0.9, sum by (le) (rate(b_bucket{n=~"$node"}[$__rate_interval])))`: {{"b_bucket", []string{"n"}}},
		`topk(10, x * on (ns, pvc) group_left () max by (ns) (label_replace(y, "pv", "$1", "v", "(.+)")))`: {
			{"x", nil}, {"y", nil}},
		`count(c == 0) or vector(0)`: {{"c", nil}},
	} {
		got, err := promSelectors(expr)
		if err != nil || !slices.EqualFunc(got, want, func(a, b selector) bool {
			return a.metric == b.metric && slices.Equal(a.labels, b.labels)
		}) {
			t.Errorf("promSelectors(%q) = %v, %v; want %v", expr, got, err, want)
		}
	}
	for _, bad := range []string{
		`sum(rate(x[5m])`, `rate(x[5m]))`, `x{a="b"`, `x{a="b}`, `rate(x[5m)`, `x{a}`, `{__name__="x"}`, `sum by (a) (`, `1 > 0`,
	} {
		if got, err := promSelectors(bad); err == nil {
			t.Errorf("promSelectors(%q) = %v, want an error", bad, got)
		}
	}
}
