package network

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netns"
)

// NetnsDir is where a netns-mode cluster's holders publish their records,
// one folder per StorageCluster (<NetnsDir>/<cluster>): the agent finds the
// cluster's namespace there, and no mover ever moves it (its folder is
// DefaultDir).
const NetnsDir = "/var/lib/berth/network/netns"

// ErrNoHolder means that a folder holds no record of a holder whose
// network namespace still lives: the holder pod is gone or not up yet.
var ErrNoHolder = errors.New("no running holder pod on this node")

// OpenHolder opens the network namespace of a live holder whose record is
// in dir: the netns mode's way in. The caller closes the handle. A folder
// of a restarted holder may still hold its predecessor's record (a killed
// holder withdraws nothing); that namespace is gone and is passed over.
func (p ProcNamespaces) OpenHolder(dir string) (netns.NsHandle, Record, error) {
	recs, listErr := Dir(dir).List()
	errs := []error{listErr}
	for _, r := range recs {
		ns, err := p.Handle(r)
		if err == nil {
			return ns, r, nil
		}
		errs = append(errs, err)
	}
	err := fmt.Errorf("%w: %s holds no record of a holder whose network namespace lives (%d records)", ErrNoHolder, dir, len(recs))
	if e := errors.Join(errs...); e != nil {
		err = fmt.Errorf("%w: %w", err, e)
	}
	return netns.None(), Record{}, err
}
