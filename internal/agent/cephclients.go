package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
	"github.com/berth-io/berth/internal/fence"
	"github.com/berth-io/berth/internal/volmap"
)

// cephClienter is a device whose servers are Ceph clients (rbdDevice):
// breaking a volume's lock must blocklist exactly the clients serving it.
type cephClienter interface {
	cephClients(volume string) ([]string, error)
}

// cephClientsOf are the Ceph client addresses serving volume through d;
// none for a device that is no Ceph client.
func cephClientsOf(d device, volume string) ([]string, error) {
	c, ok := d.(cephClienter)
	if !ok {
		return nil, nil
	}
	addrs, err := c.cephClients(volume)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", volume, err)
	}
	return addrs, nil
}

// reportServers writes into the Attachment's status the Ceph clients of
// the server that just took volume over (a heal): the record must name
// the live client, or a broken lock would fence a dead one while this one
// keeps writing. The device and staging path stay as the stage reported
// them. A node that holds a stage entry but has no status entry (its
// stage's report lost) gets one, with the device found now (F3).
func (a *Agent) reportServers(ctx context.Context, volume string, d device) error {
	if _, ok := d.(cephClienter); !ok {
		return nil
	}
	clients, err := cephClientsOf(d, volume)
	if err != nil {
		return err
	}
	var att v1.Attachment
	if err := a.api.Get(ctx, client.ObjectKey{Name: volume}, &att); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("volume %s: read its attachment to record the new server's ceph clients: %w", volume, err)
	}
	staged := fence.Staged{Node: a.node, CephClients: clients}
	if i := slices.IndexFunc(att.Status.Nodes, func(n v1.AttachmentNodeStatus) bool { return n.Node == a.node && n.Staged }); i >= 0 {
		n := att.Status.Nodes[i]
		if slices.Equal(n.CephClients, clients) {
			return nil
		}
		staged.DevicePath, staged.StagingPath = n.DevicePath, n.StagingPath
	} else {
		i := slices.IndexFunc(att.Spec.Attachments, func(e v1.AttachmentEntry) bool { return e.Node == a.node && e.IsStage() })
		if i < 0 {
			return nil // not staged here (any more)
		}
		dev, err := d.Find(ctx, volume)
		if err == nil && dev == "" {
			err = errNoDevice
		}
		if err != nil {
			return fmt.Errorf("volume %s: find its device to record its ceph clients %v: %w", volume, clients, err)
		}
		staged.DevicePath, staged.StagingPath = dev, att.Spec.Attachments[i].MountDir
	}
	if err := a.fence.ReportStaged(ctx, volume, staged); err != nil {
		return fmt.Errorf("volume %s: record the new server's ceph clients %v: %w", volume, clients, err)
	}
	a.log.Info("ceph clients of the serving server recorded", "volume", volume, "addresses", clients)
	return nil
}

// errNoDevice: a staged volume whose device is not found.
var errNoDevice = errors.New("no device attached")

// reported remembers which staged volumes' Attachment names the Ceph
// clients of their live server. One that is not (a heal whose report
// failed: the API server down; or any volume after an agent restart, as
// servers outlive the agent) is checked again on the healer's next pass,
// so the fence never keeps a dead server's addresses for long.
type reported struct{ volmap.Map[bool] }

func (r *reported) set(volume string, ok bool) {
	if ok {
		r.Put(volume, true)
	} else {
		r.Take(volume)
	}
}

func (r *reported) current(volume string) bool { return r.Get(volume) }

// reportAfterHeal records the new server's clients; a failure is logged
// and left to the next pass (checkReport): the server runs, so the heal
// itself did not fail.
func (a *Agent) reportAfterHeal(ctx context.Context, volume string, d device) {
	err := a.reportServers(ctx, volume, d)
	a.reports.set(volume, err == nil)
	if err != nil {
		a.log.Error(err, "new server's ceph clients not recorded; the healer tries again on its next pass", "volume", volume)
	}
}

// checkReport makes sure, once per server, that the Attachment names the
// clients of volume's live server. It does not wait for the volume: a
// busy one is checked on a later pass.
func (a *Agent) checkReport(ctx context.Context, volume string) {
	if a.reports.current(volume) {
		return
	}
	unlock, err := a.lock(volume)
	if err != nil {
		return
	}
	defer unlock()
	d, err := a.device(volume)
	if err != nil {
		return // unstaged meanwhile
	}
	if _, ok := d.(cephClienter); !ok {
		a.reports.set(volume, true)
		return
	}
	a.reportAfterHeal(ctx, volume, d)
}
