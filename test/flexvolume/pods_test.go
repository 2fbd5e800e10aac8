package flexvolume

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// podSpec is one pod the tests make: kubelet's mount dir for it is
// f.podDir(uid, its volume's name).
type podSpec struct {
	ns, name string
	// volume is the pod's volume: an inline flexVolume of berth's driver,
	// or a claim.
	volume corev1.Volume
	// node the pod is bound to; "" is this test's node.
	node           string
	serviceAccount string
}

// inline is a pod volume of berth's Flexvolume driver; target is its
// `volume` option ("": none, the volume is named after the pod volume).
func inline(name, target string) corev1.Volume {
	opts := map[string]string{}
	if target != "" {
		opts["volume"] = target
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "berth.io/berth", Options: opts}}}
}

// claim is a pod volume of a PersistentVolumeClaim.
func claim(name, claimName string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}
}

// pod makes the pod in the API server (with its namespace) and returns its
// UID, which kubelet would use in the pod's mount dirs.
func (f *fixture) pod(t *testing.T, p podSpec) string {
	t.Helper()
	ctx := context.Background()
	f.namespace(t, p.ns)
	if p.node == "" {
		p.node = node
	}
	if p.serviceAccount == "" {
		p.serviceAccount = "default" // what kubelet's options (see options) name
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name},
		Spec: corev1.PodSpec{
			NodeName: p.node, ServiceAccountName: p.serviceAccount, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "app", Image: "berth.local/none"}},
			Volumes:    []corev1.Volume{p.volume},
		},
	}
	if err := f.env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod %s/%s: %v", p.ns, p.name, err)
	}
	// At once: no kubelet runs to finish a graceful delete.
	t.Cleanup(func() { _ = f.env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)) })
	return string(pod.UID)
}

// namespace makes ns and its default service account, when missing.
func (f *fixture) namespace(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := f.env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if err := f.env.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
