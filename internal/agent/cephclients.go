package agent

import (
	"context"
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
// them; a node with no staged entry has nothing to update.
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
	for _, n := range att.Status.Nodes {
		if n.Node != a.node || !n.Staged {
			continue
		}
		if slices.Equal(n.CephClients, clients) {
			return nil
		}
		if err := a.fence.ReportStaged(ctx, volume, fence.Staged{Node: a.node, DevicePath: n.DevicePath,
			StagingPath: n.StagingPath, CephClients: clients}); err != nil {
			return fmt.Errorf("volume %s: record the new server's ceph clients %v: %w", volume, clients, err)
		}
		a.log.Info("ceph clients of the new server recorded", "volume", volume, "addresses", clients)
	}
	return nil
}

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
