package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-io/berth/internal/metrics"
	"github.com/berth-io/berth/internal/testenv"
	"github.com/berth-io/berth/internal/version"
)

// monitoringValues turn on every monitoring object of the chart.
var monitoringValues = []string{"monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
	"monitoring.dashboard.enabled=true"}

// scrapeLabels are the labels Prometheus adds to every series of a target
// the chart's ServiceMonitor finds (node: its relabelling).
var scrapeLabels = []string{"job", "instance", "namespace", "service", "endpoint", "pod", "container", "node"}

// otherExporters are the metrics berth's rules and panels take from
// elsewhere, which no registry in this module can show: up from
// Prometheus, kubelet_volume_stats_* from kubelet (fed by berth's
// NodeGetVolumeStats), kube_* from kube-state-metrics.
var otherExporters = []string{"up", "kubelet_volume_stats_used_bytes", "kubelet_volume_stats_capacity_bytes",
	"kube_persistentvolumeclaim_info", "kube_persistentvolume_info"}

// berthMetrics returns each series name of berthRegistry a query can
// select, with its label names.
func berthMetrics(t *testing.T) map[string][]string {
	t.Helper()
	families, err := berthRegistry(t).Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]string{}
	for _, f := range families {
		var labelNames []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labelNames, l.GetName()) {
					labelNames = append(labelNames, l.GetName())
				}
			}
		}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names[f.GetName()+"_bucket"] = append(slices.Clone(labelNames), "le")
			names[f.GetName()+"_sum"] = labelNames
			names[f.GetName()+"_count"] = labelNames
			continue
		}
		names[f.GetName()] = labelNames
	}
	return names
}

// berthRegistry builds every metric group of internal/metrics into one
// registry and records a value in each so that vectors show.
func berthRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, boundary := range []string{metrics.BoundaryCSI, metrics.BoundaryFlexvolume} {
		ops, err := metrics.NewOps(reg, boundary)
		must(err)
		ops.Observe("NodeStageVolume", metrics.CodeOK, time.Millisecond)
	}
	fence, err := metrics.NewFence(reg)
	must(err)
	fence.Acquired(metrics.AcquireGranted, time.Millisecond)
	fence.Released(nil)
	fence.Broke("NodeGone")
	gc, err := metrics.NewGC(reg)
	must(err)
	gc.Run(nil, time.Second)
	gc.Entries(1, 1, 1, 1)
	gc.Pruned(1)
	cleanup, err := metrics.NewCleanup(reg)
	must(err)
	cleanup.Pass(nil, 1, 1, 1, 1)
	heal, err := metrics.NewHeal(reg)
	must(err)
	heal.Pass(nil)
	heal.Volume("restarted", time.Second)
	share, err := metrics.NewShare(reg, "PodFailed")
	must(err)
	share.FailedOver("PodFailed")
	share.Recovered(time.Second)
	pools, err := metrics.NewPools(reg)
	must(err)
	pools.Set("berth", 1, 1)
	driver, err := metrics.NewFlexDriver(reg)
	must(err)
	driver.Set(true)
	_, err = metrics.NewNode(reg, oneVolumeNode{}, logr.Discard())
	must(err)
	_, err = metrics.NewShareStates(reg, oneShare{}, logr.Discard(), "running", "error")
	must(err)
	must(metrics.NewBuildInfo(reg, version.Get()))
	return reg
}

// oneVolumeNode is a node with one volume and a keeper that answers.
type oneVolumeNode struct{}

func (oneVolumeNode) VolumeCounts(context.Context) ([]metrics.VolumeCount, error) {
	return []metrics.VolumeCount{{State: "Available", Transport: "loop", N: 1}}, nil
}
func (oneVolumeNode) KeeperConnections(context.Context) (int, error) { return 1, nil }
func (oneVolumeNode) BlockdevIOErrors(context.Context) (map[string]uint64, error) {
	return map[string]uint64{"pvc-1": 1}, nil
}
func (oneVolumeNode) DataDirs(context.Context) ([]metrics.DataDirUsage, error) {
	return []metrics.DataDirUsage{{Dir: "/var/lib/berth/data", Size: 100, Free: 50, Promised: 60, Allocated: 40}}, nil
}

// oneShare is a cluster with one running share.
type oneShare struct{}

func (oneShare) ShareStates(context.Context) (map[string]int, error) {
	return map[string]int{"running": 1}, nil
}

// inControllerRuntime tells whether controller-runtime's registry, which
// the operator and agent serve, holds a collector of this name: registering
// another of that name fails then.
func inControllerRuntime(name string) bool {
	probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "probe"})
	if err := ctrlmetrics.Registry.Register(probe); err != nil {
		return true
	}
	ctrlmetrics.Registry.Unregister(probe)
	return false
}

// checkQuery checks one PromQL expression of a rule or panel: its brackets
// balance, and every metric it selects exists, berth's with the label names
// they have.
func checkQuery(t *testing.T, where, expr string, berth map[string][]string) {
	t.Helper()
	sels, err := promSelectors(expr)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	for _, s := range sels {
		has, ours := berth[s.metric]
		switch {
		case ours:
			for _, l := range s.labels {
				if !slices.Contains(has, l) && !slices.Contains(scrapeLabels, l) {
					t.Errorf("%s: %s has no label %s (it has %v)", where, s.metric, l, has)
				}
			}
		case slices.Contains(otherExporters, s.metric):
		case strings.HasPrefix(s.metric, "controller_runtime_") && inControllerRuntime(s.metric):
		default:
			t.Errorf("%s: metric %s does not exist (not berth's, not controller-runtime's, not in otherExporters)", where, s.metric)
		}
	}
}

// byKind returns the rendered objects of kind.
func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool { return o.GetKind() != kind })
}

// single returns the one rendered object of kind.
func single(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	of := byKind(objs, kind)
	if len(of) != 1 {
		t.Fatalf("%d %s rendered, want 1", len(of), kind)
	}
	return of[0]
}

// TestChartMonitoringOff: by default the chart renders no monitoring
// object (the Prometheus Operator's CRDs may not exist).
func TestChartMonitoringOff(t *testing.T) {
	objs := render(t)
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		if n := len(byKind(objs, kind)); n != 0 {
			t.Errorf("default values render %d %s", n, kind)
		}
	}
	for _, cm := range byKind(objs, "ConfigMap") {
		if _, ok := cm.GetLabels()["grafana_dashboard"]; ok {
			t.Errorf("default values render the dashboard ConfigMap %s", cm.GetName())
		}
	}
}

// TestChartServiceMonitor: with monitoring on, one ServiceMonitor in the
// release namespace scrapes port "metrics" of the operator's, agent's and
// CSI controller's Services (TestChartInstallsAndOperatorWorks matches its
// selector against the Services themselves) and labels each target with
// its node; the labels value reaches it.
func TestChartServiceMonitor(t *testing.T) {
	sm := single(t, render(t, append(monitoringValues, "monitoring.serviceMonitor.labels.release=kps",
		"monitoring.serviceMonitor.interval=30s")...), "ServiceMonitor")
	if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetNamespace() != releaseNamespace || sm.GetLabels()["release"] != "kps" {
		t.Errorf("ServiceMonitor %s %s/%s labels %v", sm.GetAPIVersion(), sm.GetNamespace(), sm.GetName(), sm.GetLabels())
	}
	if ns, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames"); !slices.Equal(ns, []string{releaseNamespace}) {
		t.Errorf("ServiceMonitor namespaces %v", ns)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", eps)
	}
	ep := eps[0].(map[string]any)
	relabel, _ := ep["relabelings"].([]any)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" || ep["interval"] != "30s" || len(relabel) != 1 ||
		relabel[0].(map[string]any)["targetLabel"] != "node" {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}
	// Secure metrics (the default): HTTPS with the Prometheus's token.
	tlsConfig, _ := ep["tlsConfig"].(map[string]any)
	if ep["scheme"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || tlsConfig["insecureSkipVerify"] != true {
		t.Errorf("ServiceMonitor endpoint of secure metrics %v", ep)
	}
	plain := single(t, render(t, append(monitoringValues, "monitoring.secureMetrics=false")...), "ServiceMonitor")
	eps, _, _ = unstructured.NestedSlice(plain.Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["scheme"] != "http" || ep["bearerTokenFile"] != nil || ep["tlsConfig"] != nil {
		t.Errorf("ServiceMonitor endpoint of plain metrics %v", ep)
	}
}

// TestChartSecureMetrics: by default the operator serves, and renders the
// agent and CSI controller to serve, secure metrics (--metrics-secure),
// and the chart ships the ClusterRole a Prometheus needs to read them;
// monitoring.secureMetrics=false drops the flag.
func TestChartSecureMetrics(t *testing.T) {
	args := func(objs []*unstructured.Unstructured) []string {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() != "Deployment" || o.GetName() != "berth-operator" {
				continue
			}
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			a, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
			return a
		}
		t.Fatal("no berth-operator Deployment")
		return nil
	}
	objs := render(t)
	if a := args(objs); !slices.Contains(a, "--metrics-secure") {
		t.Errorf("operator args %v lack --metrics-secure", a)
	}
	var reader *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == "berth-metrics-reader" {
			reader = o
		}
	}
	if reader == nil {
		t.Fatal("no ClusterRole berth-metrics-reader")
	}
	rules, _, _ := unstructured.NestedSlice(reader.Object, "rules")
	if len(rules) != 1 || fmt.Sprint(rules[0]) != "map[nonResourceURLs:[/metrics] verbs:[get]]" {
		t.Errorf("berth-metrics-reader rules %v", rules)
	}
	if a := args(render(t, "monitoring.secureMetrics=false")); slices.Contains(a, "--metrics-secure") {
		t.Errorf("operator args %v with secureMetrics false", a)
	}
}

// TestChartAlerts: the PrometheusRule holds alerts that each have a
// severity, a summary, a description and a runbook_url to a section of
// docs/troubleshooting.md named after the alert, are listed in
// docs/metrics.md, and query only metrics that exist; the alerts on down
// targets come only with the ServiceMonitor, whose job names they select.
func TestChartAlerts(t *testing.T) {
	berth := berthMetrics(t)
	anchors := headingAnchors(t, "docs/troubleshooting.md")
	metricsDoc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	rule := single(t, render(t, append(monitoringValues, "monitoring.prometheusRule.labels.release=kps")...), "PrometheusRule")
	if rule.GetAPIVersion() != "monitoring.coreos.com/v1" || rule.GetNamespace() != releaseNamespace || rule.GetLabels()["release"] != "kps" {
		t.Errorf("PrometheusRule %s %s/%s labels %v", rule.GetAPIVersion(), rule.GetNamespace(), rule.GetName(), rule.GetLabels())
	}
	alerts := alertsOf(t, rule)
	if len(alerts) < 10 {
		t.Errorf("%d alerts, want the set docs/metrics.md lists", len(alerts))
	}
	seen := map[string]bool{}
	duration := regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	for _, a := range alerts {
		name, _ := a["alert"].(string)
		if name == "" || seen[name] {
			t.Errorf("alert without a name, or twice: %q", name)
			continue
		}
		seen[name] = true
		expr, _ := a["expr"].(string)
		checkQuery(t, "alert "+name, expr, berth)
		if f, ok := a["for"]; ok && !duration.MatchString(f.(string)) {
			t.Errorf("alert %s: for %q", name, f)
		}
		ruleLabels, _ := a["labels"].(map[string]any)
		if sev := ruleLabels["severity"]; !slices.Contains([]any{"critical", "warning", "info"}, sev) {
			t.Errorf("alert %s: severity %v", name, sev)
		}
		ann, _ := a["annotations"].(map[string]any)
		for _, key := range []string{"summary", "description"} {
			if s, _ := ann[key].(string); len(s) < 20 {
				t.Errorf("alert %s: %s %q", name, key, s)
			}
		}
		url, _ := ann["runbook_url"].(string)
		base, anchor, _ := strings.Cut(url, "#")
		if base != "https://github.com/berth-io/berth/blob/main/docs/troubleshooting.md" || anchor != strings.ToLower(name) || !anchors[anchor] {
			t.Errorf("alert %s: runbook_url %q, want docs/troubleshooting.md#%s, a heading there", name, url, strings.ToLower(name))
		}
		if !strings.Contains(string(metricsDoc), "`"+name+"`") {
			t.Errorf("alert %s is not in docs/metrics.md", name)
		}
	}
	for _, down := range []string{"BerthOperatorDown", "BerthAgentDown", "BerthCSIControllerDown"} {
		if !seen[down] {
			t.Errorf("no alert %s with the ServiceMonitor on", down)
		}
	}
	without := alertsOf(t, single(t, render(t, "monitoring.prometheusRule.enabled=true"), "PrometheusRule"))
	for _, a := range without {
		if expr := a["expr"].(string); strings.Contains(expr, "up{") || strings.Contains(expr, "job=") {
			t.Errorf("without the ServiceMonitor, alert %s selects a job: %s", a["alert"], expr)
		}
	}
}

// alertsOf returns the alerting rules of a PrometheusRule.
func alertsOf(t *testing.T, rule *unstructured.Unstructured) []map[string]any {
	t.Helper()
	groups, _, err := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if err != nil || len(groups) == 0 {
		t.Fatalf("PrometheusRule groups: %v, %v", groups, err)
	}
	var alerts []map[string]any
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			alerts = append(alerts, r.(map[string]any))
		}
	}
	return alerts
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// file of the repository (as hack/docs-check.sh computes them, for
// headings without links or markup).
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), file))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.ToLower(strings.TrimSpace(strings.TrimLeft(text, "#")))
		var slug strings.Builder
		for _, r := range text {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteByte('-')
			}
		}
		out[slug.String()] = true
	}
	return out
}

// TestChartDashboard: the dashboard ConfigMap carries the sidecar's label
// and the JSON of files/dashboards/berth.json, whose panels have unique ids,
// use the datasource variable and query only metrics that exist.
func TestChartDashboard(t *testing.T) {
	berth := berthMetrics(t)
	objs := render(t, append(monitoringValues, "monitoring.dashboard.namespace=grafana",
		"monitoring.dashboard.annotations.grafana_folder=Storage")...)
	var cm *unstructured.Unstructured
	for _, o := range byKind(objs, "ConfigMap") {
		if o.GetName() == "berth-dashboard" {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap berth-dashboard rendered")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetNamespace() != "grafana" || cm.GetAnnotations()["grafana_folder"] != "Storage" {
		t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v", cm.GetNamespace(), cm.GetName(), cm.GetLabels(), cm.GetAnnotations())
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "berth.json")
	file, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), chartDir, "files/dashboards/berth.json"))
	if err != nil {
		t.Fatal(err)
	}
	if data != strings.TrimRight(string(file), "\n") {
		t.Error("the ConfigMap's berth.json differs from files/dashboards/berth.json")
	}
	var dash struct {
		UID        string
		Panels     []dashPanel
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
	}
	if err := json.Unmarshal(file, &dash); err != nil {
		t.Fatalf("files/dashboards/berth.json: %v", err)
	}
	if dash.UID == "" {
		t.Error("dashboard without a uid: a second import would make a copy")
	}
	ids := map[int]bool{}
	queries := 0
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("panel %q: datasource %q, %d queries", p.Title, p.Datasource.UID, len(p.Targets))
			}
			for _, q := range p.Targets {
				queries++
				checkQuery(t, "panel "+p.Title, q.Expr, berth)
			}
		}
	}
	walk(dash.Panels)
	if queries < 20 {
		t.Errorf("%d dashboard queries, want the panels of docs/metrics.md's metrics", queries)
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*), *[a-zA-Z_]+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		m := labelValues.FindStringSubmatch(q["query"].(string))
		if m == nil {
			t.Errorf("variable %s: query %v", v.Name, v.Query)
			continue
		}
		checkQuery(t, "variable "+v.Name, m[1], berth)
	}
}

type dashPanel struct {
	ID         int
	Type       string
	Title      string
	Datasource struct{ UID string }
	Targets    []struct{ Expr string }
	Panels     []dashPanel
}

// serviceMonitorSelector is the Service selector of the chart's
// ServiceMonitor.
func serviceMonitorSelector(t *testing.T) labels.Selector {
	t.Helper()
	sm := single(t, render(t, monitoringValues...), "ServiceMonitor")
	raw, _, _ := unstructured.NestedMap(sm.Object, "spec", "selector")
	var ls metav1.LabelSelector
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &ls); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// TestMetricsDocCurrent: docs/metrics.md names every metric of
// internal/metrics (berthMetrics: every group), and every berth_ metric it
// names exists; a name may be spelled with one {a,b} choice.
func TestMetricsDocCurrent(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	choice := regexp.MustCompile(`^(.*)\{([a-z_,]+)\}(.*)$`)
	for _, m := range regexp.MustCompile("`(berth_[a-z_{},]+)`").FindAllStringSubmatch(string(doc), -1) {
		if c := choice.FindStringSubmatch(m[1]); c != nil {
			for _, alt := range strings.Split(c[2], ",") {
				named[c[1]+alt+c[3]] = true
			}
			continue
		}
		named[m[1]] = true
	}
	exist, bases := map[string]bool{}, map[string]bool{}
	for series := range berthMetrics(t) {
		name := series
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suffix)
		}
		exist[name], exist[series], bases[name] = true, true, true
	}
	for name := range bases {
		if strings.HasPrefix(name, "berth_") && !named[name] {
			t.Errorf("docs/metrics.md does not name %s", name)
		}
	}
	for name := range named {
		if !exist[name] {
			t.Errorf("docs/metrics.md names %s, which no metric group makes", name)
		}
	}
}
