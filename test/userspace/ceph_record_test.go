//go:build ceph

package userspace

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// TestCephStageRecordsClientsFirstOnRealCeph (F3): a ceph volume's stage
// records its Ceph clients in the Attachment before the device is used,
// and fails, leaving nothing, when that record cannot be written (here an
// admission policy refuses the Attachment's status). Before, the stage
// formatted and mounted the volume and only logged the lost record: a
// lock broken later fenced nothing, and two nodes wrote one image.
func TestCephStageRecordsClientsFirstOnRealCeph(t *testing.T) {
	f, c, nc := cephSetup(t)
	ctx := t.Context()
	const name = "ceph-record-1"
	_, m, secrets := f.userspaceCephVolume(ctx, t, c, name, 64)

	undeny := f.denyAttachmentStatus(t, name)
	err := stageCeph(nc, m, "ext4", secrets)
	if err == nil {
		f.unstage(t, nc, m)
		t.Fatal("stage succeeded while its ceph clients could not be recorded")
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), "ceph clients") {
		t.Errorf("error %q does not say the ceph clients were not recorded", err)
	}
	f.cephLeftNothing(t, name)

	undeny()
	f.stagePublish(t, nc, m, secrets)
	clients := f.recordedClients(t, name)
	servedBy(t, clients, watchers(t, c, c.Pool+"/berth-"+name))
	t.Logf("recorded after the policy went: %v", clients)
}

// denyAttachmentStatus makes the API server refuse status writes to the
// Attachment named volume until the returned func (also run at cleanup)
// takes the refusal away; it returns once the refusal is in force.
func (f *fixture) denyAttachmentStatus(t *testing.T, volume string) func() {
	t.Helper()
	ctx := t.Context()
	probe := volume + "-probe"
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "test-deny-" + volume},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{v1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"attachments/status"}}},
			}}},
			Validations: []admissionv1.Validation{{Expression: "!(request.name in ['" + volume + "', '" + probe + "'])",
				Message: "test: status writes of " + volume + " refused"}},
		}}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}}}
	c := f.env.Client
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	removed := false
	remove := func() {
		if removed {
			return
		}
		removed = true
		for _, o := range []client.Object{binding, policy} {
			_ = c.Delete(context.Background(), o)
		}
		// Until the API server drops the policy, a status write may
		// still be refused: wait for the probe's to pass.
		_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return f.probeStatus(ctx, probe) == nil, nil
		})
		_ = c.Delete(context.Background(), &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: probe}})
	}
	t.Cleanup(remove)
	if err := c.Create(ctx, &v1.Attachment{ObjectMeta: metav1.ObjectMeta{Name: probe},
		Spec: v1.AttachmentSpec{AccessMode: v1.ReadWriteOnce, Attachments: []v1.AttachmentEntry{{Node: node, MountDir: "/probe"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return f.probeStatus(ctx, probe) != nil, nil
	}); err != nil {
		t.Fatalf("the test policy never refused a status write: %v", err)
	}
	return remove
}

// probeStatus writes a new status to the probe Attachment.
func (f *fixture) probeStatus(ctx context.Context, probe string) error {
	var att v1.Attachment
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: probe}, &att); err != nil {
		return err
	}
	att.Status.Devices = time.Now().Format(time.RFC3339Nano)
	return f.env.Client.Status().Update(ctx, &att)
}
