package v1alpha1_test

import (
	"slices"
	"strings"
	"testing"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

func cephSpec() *v1.CephSpec {
	return &v1.CephSpec{
		Monitors:  []v1.CephMonitor{"10.0.0.1:3300", "[fd00::1]:6789", "v2:mon-b.ceph.svc:3300"},
		Pool:      "rbd",
		SecretRef: v1.CephSecretReference{Name: "berth-ceph", Namespace: "berth-system"},
	}
}

func cephCluster(name string, change func(*v1.CephSpec)) *v1.StorageCluster {
	c := cephSpec()
	if change != nil {
		change(c)
	}
	return &v1.StorageCluster{ObjectMeta: meta(name), Spec: v1.StorageClusterSpec{Backend: v1.BackendCeph, Ceph: c}}
}

func TestStorageClusterCeph(t *testing.T) {
	suite.Require(t)
	var got v1.StorageCluster
	createAndRead(t, cephCluster("ceph-ok", nil), &got)
	if !slices.Equal(got.Spec.Ceph.ImageFeatures, []v1.CephImageFeature{"layering", "exclusive-lock"}) {
		t.Errorf("image features default: %v", got.Spec.Ceph.ImageFeatures)
	}

	// The pool is fixed once set; other fields may change.
	got.Spec.Ceph.Pool = "other"
	if err := env.Client.Update(ctx(t), &got); err == nil {
		t.Error("pool change accepted")
	} else if !contains(err, "ceph.pool cannot be changed") {
		t.Errorf("pool change: %v", err)
	}
	got.Spec.Ceph.Pool = "rbd"
	got.Spec.Ceph.Monitors = []v1.CephMonitor{"10.0.0.2:3300"}
	got.Spec.Ceph.ImageFeatures = append(got.Spec.Ceph.ImageFeatures, "object-map", "fast-diff")
	if err := env.Client.Update(ctx(t), &got); err != nil {
		t.Errorf("monitor and feature change: %v", err)
	}

	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("ceph-bare"), Spec: v1.StorageClusterSpec{Backend: v1.BackendCeph}},
		"spec.ceph is required when backend is ceph")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("local-with-ceph"), Spec: v1.StorageClusterSpec{Ceph: cephSpec()}},
		"spec.ceph is only allowed when backend is ceph")
	mustRefuse(t, &v1.StorageCluster{ObjectMeta: meta("local-with-ceph2"), Spec: v1.StorageClusterSpec{Backend: v1.BackendLocal, Ceph: cephSpec()}},
		"spec.ceph is only allowed when backend is ceph")
	// The nodes' Secret may be added to a cluster made without it (the
	// operator makes its classes anew), never changed or removed: the
	// volumes made since name it.
	got.Spec.Ceph.NodeSecretRef = &v1.CephSecretReference{Name: "berth-ceph-node", Namespace: "berth-system"}
	if err := env.Client.Update(ctx(t), &got); err != nil {
		t.Errorf("nodeSecretRef added later: %v, want admitted", err)
	}
	removed := got.DeepCopy()
	removed.Spec.Ceph.NodeSecretRef = nil
	if err := env.Client.Update(ctx(t), removed); err == nil || !contains(err, "nodeSecretRef may be added but not changed or removed") {
		t.Errorf("nodeSecretRef removed: %v, want refused", err)
	}
	var keyed v1.StorageCluster
	createAndRead(t, cephCluster("ceph-node-key", func(c *v1.CephSpec) {
		c.NodeSecretRef = &v1.CephSecretReference{Name: "berth-ceph-node", Namespace: "berth-system"}
	}), &keyed)
	if keyed.Spec.Ceph.NodeStageSecret().Name != "berth-ceph-node" {
		t.Errorf("node-stage secret %+v", keyed.Spec.Ceph.NodeStageSecret())
	}
	keyed.Spec.Ceph.NodeSecretRef.Name = "other"
	if err := env.Client.Update(ctx(t), &keyed); err == nil || !contains(err, "nodeSecretRef may be added but not changed or removed") {
		t.Errorf("nodeSecretRef changed: %v, want refused", err)
	}
	overcommitted := cephCluster("ceph-overcommit", nil)
	overcommitted.Spec.Overcommit = &v1.OvercommitSpec{Percent: 200}
	mustRefuse(t, overcommitted, "spec.overcommit is only allowed when backend is local")
	for _, percent := range []int32{99, 10001} {
		c := &v1.StorageCluster{ObjectMeta: meta("overcommit-out-of-range"), Spec: v1.StorageClusterSpec{Overcommit: &v1.OvercommitSpec{Percent: percent}}}
		mustRefuse(t, c, "spec.overcommit.percent")
	}
	var thin v1.StorageCluster
	createAndRead(t, &v1.StorageCluster{ObjectMeta: meta("local-overcommit"), Spec: v1.StorageClusterSpec{Overcommit: &v1.OvercommitSpec{Percent: 300}}}, &thin)
	if thin.Spec.Overcommit == nil || thin.Spec.Overcommit.Percent != 300 {
		t.Errorf("overcommit read back: %+v", thin.Spec.Overcommit)
	}
	for _, tc := range []struct {
		name   string
		change func(*v1.CephSpec)
		want   []string
	}{
		{"no-monitors", func(c *v1.CephSpec) { c.Monitors = nil }, []string{"spec.ceph.monitors"}},
		{"empty-monitors", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{} }, []string{"spec.ceph.monitors"}},
		{"monitor-no-port", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"10.0.0.1"} }, []string{"spec.ceph.monitors[0]"}},
		{"monitor-port-0", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"10.0.0.1:0"} }, []string{"spec.ceph.monitors[0]"}},
		{"monitor-port-big", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"10.0.0.1:65536"} }, []string{"spec.ceph.monitors[0]"}},
		{"monitor-ipv6-bare", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"fd00::1:3300"} }, []string{"spec.ceph.monitors[0]"}},
		{"monitor-list", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"10.0.0.1:3300,10.0.0.2:3300"} }, []string{"spec.ceph.monitors[0]"}},
		{"monitor-v3", func(c *v1.CephSpec) { c.Monitors = []v1.CephMonitor{"v3:10.0.0.1:3300"} }, []string{"spec.ceph.monitors[0]"}},
		{"no-pool", func(c *v1.CephSpec) { c.Pool = "" }, []string{"spec.ceph.pool"}},
		{"pool-slash", func(c *v1.CephSpec) { c.Pool = "a/b" }, []string{"spec.ceph.pool"}},
		{"data-pool-at", func(c *v1.CephSpec) { c.DataPool = "a@b" }, []string{"spec.ceph.dataPool"}},
		{"no-secret-name", func(c *v1.CephSpec) { c.SecretRef.Name = "" }, []string{"spec.ceph.secretRef.name"}},
		{"no-secret-namespace", func(c *v1.CephSpec) { c.SecretRef.Namespace = "" }, []string{"spec.ceph.secretRef.namespace"}},
		{"unknown-feature", func(c *v1.CephSpec) {
			c.ImageFeatures = []v1.CephImageFeature{"layering", "exclusive-lock", "striping"}
		}, []string{"spec.ceph.imageFeatures[2]", `"layering"`}},
		{"no-exclusive-lock", func(c *v1.CephSpec) { c.ImageFeatures = []v1.CephImageFeature{"layering"} },
			[]string{"must include layering (snapshots, clones) and exclusive-lock"}},
		{"fast-diff-alone", func(c *v1.CephSpec) {
			c.ImageFeatures = []v1.CephImageFeature{"layering", "exclusive-lock", "fast-diff"}
		},
			[]string{"fast-diff needs object-map"}},
		{"feature-twice", func(c *v1.CephSpec) {
			c.ImageFeatures = []v1.CephImageFeature{"layering", "exclusive-lock", "layering"}
		},
			[]string{"spec.ceph.imageFeatures[2]", "Duplicate"}},
	} {
		t.Run(tc.name, func(t *testing.T) { mustRefuse(t, cephCluster("ceph-"+tc.name, tc.change), tc.want...) })
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
