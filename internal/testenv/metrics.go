package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago,
// for an endpoint of a process a test starts.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// FreePort is the port of FreeAddr, for a server a test configures by port.
func FreePort(tb testing.TB) int {
	tb.Helper()
	addr, err := FreeAddr()
	if err != nil {
		tb.Fatal(err)
	}
	return int(netip.MustParseAddrPort(addr).Port())
}

// Samples are scraped metric values by series: `name{label="value",...}`
// with labels sorted by name; a histogram gives `name_count{...}` and
// `name_sum{...}`.
type Samples map[string]float64

// Scrape GETs url (a /metrics endpoint) and parses the text exposition.
func Scrape(ctx context.Context, url string) (Samples, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	list := make([]*dto.MetricFamily, 0, len(families))
	for _, f := range families {
		list = append(list, f)
	}
	return flatten(list), nil
}

// ScrapeAddr is Scrape of http://addr/metrics for a test: an error fails t.
func ScrapeAddr(t testing.TB, addr string) Samples {
	t.Helper()
	s, err := Scrape(context.Background(), "http://"+addr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// WantDelta fails t unless series moved by want between two scrapes of what.
func WantDelta(t testing.TB, what string, before, after Samples, series string, want float64) {
	t.Helper()
	if got := after[series] - before[series]; got != want {
		t.Errorf("%s: %s moved by %v, want %v", what, series, got, want)
	}
}

// Gathered is what g (a registry in a unit test) holds, as Scrape returns it.
func Gathered(g prometheus.Gatherer) (Samples, error) {
	families, err := g.Gather()
	if err != nil {
		return nil, err
	}
	return flatten(families), nil
}

func flatten(families []*dto.MetricFamily) Samples {
	out := Samples{}
	for _, f := range families {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			labels := series(m.GetLabel())
			switch {
			case m.Counter != nil:
				out[name+labels] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name+labels] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[name+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			case m.Untyped != nil:
				out[name+labels] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// Series names one series as Samples keys it: Series("berth_csi_requests_total",
// "operation", "NodeStageVolume", "code", "OK").
func Series(name string, labelPairs ...string) string {
	var ls []*dto.LabelPair
	for i := 0; i+1 < len(labelPairs); i += 2 {
		ls = append(ls, &dto.LabelPair{Name: &labelPairs[i], Value: &labelPairs[i+1]})
	}
	return name + series(ls)
}

func series(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// GetOK fails unless GET url answers 200 within 10 s (a health endpoint).
func GetOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := get(ctx, url)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// WantOK is GetOK for a test: an error fails t and the test goes on.
func WantOK(t testing.TB, url string) {
	t.Helper()
	if err := GetOK(context.Background(), url); err != nil {
		t.Error(err)
	}
}

// get GETs url and refuses any answer but 200; the caller closes the body.
func get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}
