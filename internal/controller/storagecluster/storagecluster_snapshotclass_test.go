package storagecluster_test

import (
	"context"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/controller/storagecluster"
)

var snapshotClassGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotClass"}

// snapshotClassCRD stands in for the VolumeSnapshotClass CRD that a
// distribution installs (external-snapshotter's client/config/crd): the
// fields berth sets, in the same places.
const snapshotClassCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: volumesnapshotclasses.snapshot.storage.k8s.io
  # A *.k8s.io group: the API server wants the approval upstream names.
  annotations: {api-approved.kubernetes.io: "https://github.com/kubernetes-csi/external-snapshotter/pull/814"}
spec:
  group: snapshot.storage.k8s.io
  scope: Cluster
  names: {kind: VolumeSnapshotClass, listKind: VolumeSnapshotClassList, plural: volumesnapshotclasses, singular: volumesnapshotclass}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [driver, deletionPolicy]
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          driver: {type: string}
          deletionPolicy: {type: string, enum: [Delete, Retain]}
          parameters: {type: object, additionalProperties: {type: string}}
`

// TestStorageClusterSnapshotClass: without the snapshot API a StorageCluster
// is applied as before and no class is made; installing the API's CRD makes
// the VolumeSnapshotClass appear with nothing else happening; a reconcile
// that changes nothing leaves it alone; and a CRD removed under a running
// operator does not fail its reconciles.
func TestStorageClusterSnapshotClass(t *testing.T) {
	suite.Require(t)
	sc := newCluster(t, "snap", v1.StorageClusterSpec{})
	get(t, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "snap-userspace"}})
	// A reconciler with its own client, whose REST mapper sees the API come
	// and go as the operator's would.
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	r := reconcilerOn(c)
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: sc.Name}}
	eventually(t, "a reconcile without the snapshot API succeeds", func(ctx context.Context) (bool, error) {
		_, err := r.Reconcile(ctx, req)
		return err == nil, err
	})

	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(snapshotClassCRD), &crd.Object); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(testCtx(t), crd); err != nil {
		t.Fatalf("install the VolumeSnapshotClass CRD: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), crd) })

	// Only the CRD's arrival can bring the running operator back here.
	cls := &unstructured.Unstructured{}
	cls.SetGroupVersionKind(snapshotClassGVK)
	cls.SetName(storagecluster.SnapshotClassName(sc.Name))
	get(t, cls)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cls) })
	if d, _, _ := unstructured.NestedString(cls.Object, "driver"); d != v1.DriverName {
		t.Errorf("driver %q, want %s", d, v1.DriverName)
	}
	if p, _, _ := unstructured.NestedString(cls.Object, "deletionPolicy"); p != "Delete" {
		t.Errorf("deletionPolicy %q, want Delete", p)
	}
	if a := cls.GetAnnotations()["snapshot.storage.kubernetes.io/is-default-class"]; a != "true" {
		t.Errorf("is-default-class %q, want true", a)
	}
	if got := cls.GetLabels()["app.kubernetes.io/instance"]; got != sc.Name {
		t.Errorf("instance label %q, want %s", got, sc.Name)
	}
	checkControlledBy(t, cls, sc)

	version := cls.GetResourceVersion()
	eventually(t, "a reconcile with the snapshot API succeeds", func(ctx context.Context) (bool, error) {
		_, err := r.Reconcile(ctx, req)
		return err == nil, err
	})
	if err := env.Client.Get(testCtx(t), client.ObjectKeyFromObject(cls), cls); err != nil {
		t.Fatal(err)
	}
	if cls.GetResourceVersion() != version {
		t.Errorf("a reconcile without change updated the VolumeSnapshotClass (resourceVersion %s -> %s)", version, cls.GetResourceVersion())
	}

	if err := env.Client.Delete(testCtx(t), crd); err != nil {
		t.Fatal(err)
	}
	gone(t, crd)
	eventually(t, "a reconcile after the CRD went succeeds", func(ctx context.Context) (bool, error) {
		_, err := r.Reconcile(ctx, req)
		return err == nil, err
	})
}
