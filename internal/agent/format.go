package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/mount"
)

// +kubebuilder:rbac:groups=berth.io,resources=volumes/status,verbs=patch

func (a *Agent) now() metav1.Time {
	if a.clock == nil {
		return metav1.Now()
	}
	return metav1.NewTime(a.clock.Now())
}

// formatPolicy says whether stage may format the volume when blkid finds
// nothing on it: never once a filesystem was recorded (on the image or in
// status) or when the volume is a copy, whose content is its source's;
// otherwise only if its image reads as zeros (mount checks that). recs
// hold the image's record (formatRecords); a record that cannot be read
// fails the stage.
func (a *Agent) formatPolicy(ctx context.Context, vol *v1.Volume, recs FormatRecords) (mount.FormatPolicy, error) {
	img, err := a.volumeImages().Get(ctx, vol.Name)
	if err != nil {
		return mount.FormatPolicy{}, fmt.Errorf("image of volume %s: %w", vol.Name, err)
	}
	p := mount.FormatPolicy{}
	if filepath.IsAbs(img.Path) {
		// A local image's file; an RBD image (POOL/IMAGE) has none.
		p.Image = img.Path
	}
	rec, found, err := recs.Format(ctx, vol.Name)
	if err != nil {
		return mount.FormatPolicy{}, fmt.Errorf("volume %s: its format record, which says whether it holds a filesystem, "+
			"cannot be read, so it is not staged (it might be formatted over data): %w", vol.Name, err)
	}
	if found {
		p.Never, p.Why = true, fmt.Sprintf("its image records a %s filesystem made or found %s", rec.FSType, rec.Time.Format(time.RFC3339))
	} else if why := vol.NeverFormatReason(); why != "" {
		p.Never, p.Why = true, why
	}
	return p, nil
}

// recordFormat records that the staged volume holds an fsType filesystem:
// on its image (recs: synced xattr, RBD image metadata), which stage
// trusts, and in its status, for people and for a stage after the image
// record was lost. A status write that fails is logged; the next stage
// writes it again. Records that exist are kept: the first time is the one
// that counts.
//
// A Volume without a node (a ceph volume, which any node may stage) gets
// no status record: the admission policy lets an agent write only its own
// node's Volumes, and widening that to every agent writing every ceph
// Volume's status would let one node's agent block (or, with a wrong
// record, mislead) volumes it never staged. Its record lives with its data
// in the RBD image instead, which also copies it into clones.
func (a *Agent) recordFormat(ctx context.Context, vol *v1.Volume, fsType string, recs FormatRecords) error {
	at := a.now()
	if err := recs.RecordFormat(ctx, vol.Name, fsType, at.Time); err != nil {
		return fmt.Errorf("record format of volume %s: %w", vol.Name, err)
	}
	if a.status == nil || vol.Status.Formatted != nil || vol.Spec.Node == "" {
		return nil
	}
	patch := client.MergeFrom(vol.DeepCopy())
	vol.Status.Formatted = &v1.VolumeFormat{FSType: fsType, Time: at}
	if err := a.status.Status().Patch(ctx, vol, patch); err != nil {
		a.log.Error(err, "record format in Volume status; the image holds the record", "volume", vol.Name)
	}
	return nil
}
