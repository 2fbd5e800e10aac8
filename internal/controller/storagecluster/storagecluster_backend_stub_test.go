//go:build !ceph

package storagecluster_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-io/berth/internal/controller/storagecluster"
)

// Without the ceph tag a complete ceph config is refused by name.
func TestBackendReadyCephNotBuilt(t *testing.T) {
	cephSecret(t, "ceph-notbuilt", map[string]string{"userID": "berth", "userKey": "AQBfakefakefakefakefakefakefakefakefake=="})
	sc := newCluster(t, "ceph-notbuilt", cephClusterSpec([]string{"127.0.0.1:3300"}, "rbd", "ceph-notbuilt"))
	c := waitBackend(t, sc, metav1.ConditionFalse, storagecluster.ReasonCephNotBuilt, "AQBfakefakefakefakefakefakefakefakefake==")
	if c.Message != "berth built without the ceph backend (build tag ceph)" {
		t.Errorf("message %q", c.Message)
	}
}
