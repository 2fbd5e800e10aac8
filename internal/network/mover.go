package network

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// Mover keeps a copy of each live holder's interface in the host namespace
// (see the package doc). It is not safe for concurrent use: Run is its only
// caller, so a copy in the making is never seen by another round.
type Mover struct {
	host Stack
	nss  Namespaces
	recs Records
	log  logr.Logger
	// Interval is the time between rounds, each of which also retries what
	// failed in the one before (0: 5s).
	Interval time.Duration
	// configs keeps the whole configuration read from each original that
	// this process copied: going down flushes an original's IPv4 routes and
	// IPv6 addresses, and a copy lacks its default routes.
	configs map[string]ipConfig
	// known is the records of the last round: a holder that withdrew its
	// record (it is stopping) may still have its namespace, and gets its
	// original back.
	known map[string]Record
}

// NewMover returns a mover that makes copies in host.
func NewMover(host Stack, nss Namespaces, recs Records, log logr.Logger) *Mover {
	return &Mover{host: host, nss: nss, recs: recs, log: log, configs: map[string]ipConfig{}, known: map[string]Record{}}
}

// Run makes and removes copies until ctx ends, then removes every copy and
// gives each live holder its interface back.
func (m *Mover) Run(ctx context.Context) error {
	interval := m.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.Sync(); err != nil {
			m.log.Error(err, "mover round failed; retrying", "in", interval)
		}
		select {
		case <-ctx.Done():
			return m.RemoveAll()
		case <-t.C:
		}
	}
}

// round is what a round starts from: the holders' records and the copies
// in the host namespace, both by holder pod UID.
type round struct {
	recs   []Record
	byUID  map[string]Record
	copies map[string]Link
	marks  map[string]mark
}

// look reads the records and the copies. A record that does not parse is
// reported in listErr and left out; the rest are served.
func (m *Mover) look() (r round, listErr, err error) {
	r.recs, listErr = m.recs.List()
	r.byUID = make(map[string]Record, len(r.recs))
	for _, rec := range r.recs {
		r.byUID[rec.PodUID] = rec
	}
	links, err := m.host.Links()
	if err != nil {
		return r, listErr, err
	}
	r.copies, r.marks = map[string]Link{}, map[string]mark{}
	for _, l := range links {
		if mk, ok := ownedCopy(l); ok {
			r.copies[mk.podUID], r.marks[mk.podUID] = l, mk
		}
	}
	return r, listErr, nil
}

// Sync is one round: remove the copies whose holder is gone, whose
// original changed, or that a killed mover left half made; copy every live
// holder that has no copy.
func (m *Mover) Sync() error {
	r, listErr, err := m.look()
	if err != nil {
		return errors.Join(listErr, err)
	}
	errs := []error{listErr}
	byUID, marks := r.byUID, r.marks
	for uid, c := range r.copies {
		rec, ok := byUID[uid]
		if !ok {
			m.log.Info("removing the copy of a holder that withdrew its record", "copy", c.Name, "holder", uid)
			errs = append(errs, m.removeRestoring(c, m.known[uid]))
			continue
		}
		hs, err := m.nss.Open(rec)
		if errors.Is(err, ErrHolderGone) {
			m.log.Info("removing the copy of a holder that is gone: the node loses this storage network until a new holder runs", "copy", c.Name, "holder", uid, "pod", rec.PodNamespace+"/"+rec.PodName)
			errs = append(errs, m.remove(c, nil))
			delete(byUID, uid)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			delete(byUID, uid)
			continue
		}
		orig, err := hs.Link(rec.Interface)
		switch {
		case err != nil && !errors.Is(err, ErrNoLink):
			errs = append(errs, err)
			delete(byUID, uid)
		case err != nil || !macEqual(orig.MAC, c.MAC) || marks[uid].iface != rec.Interface:
			m.log.Info("removing a copy whose holder interface changed", "copy", c.Name, "holder", uid)
			errs = append(errs, m.remove(c, nil))
		case marks[uid].state != stateCopied:
			m.log.Info("removing a copy left half made", "copy", c.Name, "holder", uid)
			errs = append(errs, m.remove(c, hs))
		default:
			delete(byUID, uid) // in place
		}
		hs.Close()
	}
	for _, rec := range r.recs {
		if _, todo := byUID[rec.PodUID]; todo {
			errs = append(errs, m.copy(rec))
		}
	}
	m.known = make(map[string]Record, len(r.recs))
	for _, rec := range r.recs {
		m.known[rec.PodUID] = rec
	}
	return errors.Join(errs...)
}

// copy makes rec's copy: all of it, or, on any failure, nothing, with the
// original back up.
func (m *Mover) copy(rec Record) (err error) {
	hs, err := m.nss.Open(rec)
	if errors.Is(err, ErrHolderGone) {
		m.log.V(1).Info("holder record of a gone holder: nothing to copy", "holder", rec.PodUID)
		return nil
	}
	if err != nil {
		return err
	}
	defer hs.Close()
	orig, err := hs.Link(rec.Interface)
	if err != nil {
		return fmt.Errorf("holder %s: %w", rec.PodUID, err)
	}
	if orig.Kind != "macvlan" {
		return fmt.Errorf("holder %s: interface %s is a %s, the mover copies macvlan interfaces only", rec.PodUID, rec.Interface, orig.Kind)
	}
	cfg, ok := m.configs[rec.PodUID]
	if !ok || orig.Up {
		if cfg, err = readConfig(hs, rec.Interface); err != nil {
			return fmt.Errorf("holder %s: %w", rec.PodUID, err)
		}
	}
	routes, skipped := hostRoutes(cfg)
	if len(skipped) > 0 {
		m.log.Info("not copying default routes: the host keeps its own", "holder", rec.PodUID, "routes", fmt.Sprint(skipped))
	}
	c := Link{Name: CopyName(rec.PodUID), ParentIndex: orig.ParentIndex, Mode: orig.Mode, MAC: orig.MAC, MTU: orig.MTU, Alias: copyAlias(stateCopying, rec)}

	created, origDown := false, false
	defer func() {
		if err == nil {
			return
		}
		// The copy goes first: the original cannot come up while an up
		// interface on the same parent has its MAC.
		if created {
			if derr := m.host.DeleteLink(c.Name); derr != nil {
				err = errors.Join(err, fmt.Errorf("remove partial copy %s (removed next round): %w", c.Name, derr))
			}
		}
		if origDown {
			err = errors.Join(err, restore(hs, rec.Interface, cfg))
		}
		err = fmt.Errorf("copy holder %s interface %s: %w", rec.PodUID, rec.Interface, err)
	}()
	if err = m.host.AddMacvlan(c); err != nil {
		return err
	}
	created = true
	// Addresses go on while the copy is down, so it comes up whole.
	if err = apply(m.host, c.Name, cfg.addrs, nil, false); err != nil {
		return err
	}
	origDown = orig.Up
	if err = hs.SetUp(rec.Interface, false); err != nil {
		return err
	}
	origDown = true
	if err = m.host.SetUp(c.Name, true); err != nil {
		return err
	}
	// Routes need an up interface. One the host has already (the copy of
	// another holder on the same network routes it) is left to that one.
	for _, r := range routes {
		if err = m.host.AddRoute(c.Name, r); errors.Is(err, unix.EEXIST) {
			m.log.Info("route exists in the host namespace already: not copied", "holder", rec.PodUID, "route", r.String())
			err = nil
		}
		if err != nil {
			return err
		}
	}
	if err = m.host.SetAlias(c.Name, copyAlias(stateCopied, rec)); err != nil {
		return err
	}
	m.configs[rec.PodUID] = cfg
	m.log.Info("copied holder interface into the host namespace", "holder", rec.PodUID, "pod", rec.PodNamespace+"/"+rec.PodName,
		"interface", rec.Interface, "copy", c.Name, "mac", c.MAC.String(), "addresses", len(cfg.addrs), "routes", len(routes))
	return nil
}

// restore brings an original back up with its configuration.
func restore(hs Stack, iface string, cfg ipConfig) error {
	if err := hs.SetUp(iface, true); err != nil {
		return fmt.Errorf("restore original %s: %w", iface, err)
	}
	if err := apply(hs, iface, cfg.addrs, cfg.routes, true); err != nil {
		return fmt.Errorf("restore configuration of original %s: %w", iface, err)
	}
	return nil
}

// remove deletes a copy; with hs (the live holder's namespace) it also
// brings the original back up.
func (m *Mover) remove(c Link, hs Stack) error {
	mk, _ := ownedCopy(c)
	cfg, ok := m.configs[mk.podUID]
	if !ok && hs != nil {
		var err error
		if cfg, err = readConfig(m.host, c.Name); err != nil && !errors.Is(err, ErrNoLink) {
			return err
		}
	}
	if err := m.host.DeleteLink(c.Name); err != nil && !errors.Is(err, ErrNoLink) {
		return err
	}
	delete(m.configs, mk.podUID)
	if hs == nil {
		return nil
	}
	return restore(hs, mk.iface, cfg)
}

// RemoveAll removes every copy and gives each live holder its interface
// back.
func (m *Mover) RemoveAll() error {
	r, listErr, err := m.look()
	if err != nil {
		return errors.Join(listErr, err)
	}
	errs := []error{listErr}
	for uid, c := range r.copies {
		rec, ok := r.byUID[uid]
		if !ok {
			rec = m.known[uid]
		}
		errs = append(errs, m.removeRestoring(c, rec))
	}
	return errors.Join(errs...)
}

// removeRestoring removes a copy and, if rec's namespace still lives (a
// zero rec has none), gives the holder its original back.
func (m *Mover) removeRestoring(c Link, rec Record) error {
	var hs Stack
	var openErr error
	if rec.PodUID != "" {
		if hs, openErr = m.nss.Open(rec); openErr != nil {
			hs = nil
			if errors.Is(openErr, ErrHolderGone) {
				openErr = nil
			}
		}
	}
	if hs != nil {
		defer hs.Close()
	}
	if err := m.remove(c, hs); err != nil {
		return errors.Join(openErr, err)
	}
	m.log.Info("removed copy", "copy", c.Name, "holder", rec.PodUID, "originalRestored", hs != nil)
	return openErr
}
