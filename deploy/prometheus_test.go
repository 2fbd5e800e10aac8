package deploy_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/berth-io/berth/internal/testenv"
)

// TestAlertsEvaluateInPrometheus loads the chart's alerts into a real
// Prometheus (Debian's, unpacked by hack/prometheus.sh) that scrapes every
// metric group of berth as its components serve them: promtool accepts
// the rules, and Prometheus evaluates every alert's expression, over
// berth's series, without an error.
func TestAlertsEvaluateInPrometheus(t *testing.T) {
	dir := os.Getenv("BERTH_PROMETHEUS_DIR")
	if dir == "" {
		t.Skip("needs Prometheus: BERTH_PROMETHEUS_DIR=$(hack/prometheus.sh | tail -n1) (make test sets it)")
	}
	work := t.TempDir()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(berthRegistry(t), promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	rule := single(t, render(t, monitoringValues...), "PrometheusRule")
	groups, _, err := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if err != nil {
		t.Fatal(err)
	}
	alerts := len(alertsOf(t, rule))
	rules := filepath.Join(work, "rules.yaml")
	writeYAML(t, rules, map[string]any{"groups": groups})
	if out, err := exec.Command(filepath.Join(dir, "promtool"), "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}

	config := filepath.Join(work, "prometheus.yaml")
	writeYAML(t, config, map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rules},
		"scrape_configs": []any{map[string]any{"job_name": "berth",
			"static_configs": []any{map[string]any{"targets": []string{ln.Addr().String()}}}}},
	})
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	p, err := testenv.StartProcess(filepath.Join(work, "prometheus.log"), filepath.Join(dir, "prometheus"),
		"--config.file="+config, "--storage.tsdb.path="+filepath.Join(work, "data"), "--web.listen-address="+addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(syscall.SIGTERM, 20*time.Second) })
	log := func() string { b, _ := os.ReadFile(filepath.Join(work, "prometheus.log")); return string(b) }

	// Once berth's target is up, every rule is evaluated within a second;
	// three more make sure each saw its series.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var q struct {
			Data struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		err := getJSON("http://"+addr+"/api/v1/query?query="+url.QueryEscape(`up{job="berth"} == 1`), &q)
		if err == nil && len(q.Data.Result) == 1 {
			break
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("berth's target not up in Prometheus (%v); log:\n%s", err, log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)

	var r struct {
		Data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name           string    `json:"name"`
					Health         string    `json:"health"`
					LastError      string    `json:"lastError"`
					LastEvaluation time.Time `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := getJSON("http://"+addr+"/api/v1/rules?type=alert", &r); err != nil {
		t.Fatal(err)
	}
	evaluated := 0
	for _, g := range r.Data.Groups {
		for _, rl := range g.Rules {
			if rl.Health != "ok" || rl.LastEvaluation.IsZero() {
				t.Errorf("alert %s (group %s): health %q, last evaluated %v, error %q", rl.Name, g.Name, rl.Health, rl.LastEvaluation, rl.LastError)
				continue
			}
			evaluated++
		}
	}
	if evaluated != alerts {
		t.Errorf("Prometheus evaluated %d alerts without an error, the PrometheusRule has %d", evaluated, alerts)
	}
	t.Logf("%d alerts evaluated by Prometheus over berth's metrics", evaluated)
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// getJSON decodes the body of a GET of u into v.
func getJSON(u string, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
