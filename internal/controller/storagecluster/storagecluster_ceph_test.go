//go:build ceph

package storagecluster_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/controller/storagecluster"
	"github.com/berth-io/berth/internal/testenv/testceph"
)

// The operator tests' own test Ceph (folder and ports apart from the
// backend's and testceph's), started by the first test that needs it and
// stopped after the last test.
var cephLazy = &testceph.Lazy{Name: "storagecluster", Options: testceph.Options{Dir: "/var/lib/berth-ceph-operator-test", Addr: "127.0.0.1",
	MonPort: 3312, PortMin: 7100, PortMax: 7199},
	AtEnd: func(stop func()) { afterTests = append(afterTests, stop) }}

func testCeph(t *testing.T) *testceph.Cluster { t.Helper(); return cephLazy.Get(t) }

// Each wrong part of a ceph config is named on BackendReady (and Ready, and
// an Event) within a bounded time; the right config connects.
func TestBackendReadyOnRealCeph(t *testing.T) {
	suite.Require(t)
	c := testCeph(t)
	key, err := c.ClientKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := exec.Command("ceph-authtool", "--gen-print-key").Output()
	if err != nil {
		t.Fatal(err)
	}
	wrongPort := strings.Replace(c.Monitors, ":3312", ":1", 1)
	for _, tc := range []struct {
		name, monitors, pool, client, key string
		status                            metav1.ConditionStatus
		reason, says                      string
	}{
		{"good", c.Monitors, c.Pool, c.Client, key, metav1.ConditionTrue, storagecluster.ReasonConnected, "pool " + c.Pool + " is usable"},
		{"client-prefix", c.Monitors, c.Pool, "client." + c.Client, key, metav1.ConditionTrue, storagecluster.ReasonConnected, "as client." + c.Client + ";"},
		{"wrong-port", wrongPort, c.Pool, c.Client, key, metav1.ConditionFalse, storagecluster.ReasonMonitorsUnreachable, "monitors unreachable"},
		{"wrong-key", c.Monitors, c.Pool, c.Client, strings.TrimSpace(string(other)), metav1.ConditionFalse, storagecluster.ReasonAuthenticationFailed, "key refused"},
		{"unknown-client", c.Monitors, c.Pool, "nobody", key, metav1.ConditionFalse, storagecluster.ReasonAuthenticationFailed, "key refused"},
		{"missing-pool", c.Monitors, "no-such-pool", c.Client, key, metav1.ConditionFalse, storagecluster.ReasonPoolNotFound, "open pool no-such-pool: pool not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "ceph-" + tc.name
			cephSecret(t, name, map[string]string{"userID": tc.client, "userKey": tc.key})
			start := time.Now()
			sc := newCluster(t, name, cephClusterSpec([]string{tc.monitors}, tc.pool, name))
			cond := waitBackend(t, sc, tc.status, tc.reason, tc.key)
			took := time.Since(start)
			t.Logf("%s after %s: %s", cond.Reason, took.Round(time.Millisecond), cond.Message)
			if !strings.Contains(cond.Message, tc.says) {
				t.Errorf("message %q does not say %q", cond.Message, tc.says)
			}
			// No nodeSecretRef here: a usable cluster says the nodes share
			// the operator's key (F5).
			if tc.status == metav1.ConditionTrue && !strings.HasSuffix(cond.Message, storagecluster.SharedNodeKeyHint) {
				t.Errorf("message %q does not end with the shared node key hint", cond.Message)
			}
			// Connect and op timeouts are 3 s here; a check is bounded by 6 s.
			if took > 10*time.Second {
				t.Errorf("took %s", took)
			}
		})
	}
}
