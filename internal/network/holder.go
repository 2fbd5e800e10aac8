package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
)

// RecordStore is where a holder publishes its record.
type RecordStore interface {
	Write(Record) error
	Read(podUID string) (Record, error)
	Remove(podUID string) error
}

// Holder publishes its pod's storage network interface for the mover and
// otherwise only lives: its pod's namespace, and the interface in it,
// outlive every agent and mover restart.
type Holder struct {
	stack Stack
	self  func() (NSID, error)
	store RecordStore
	log   logr.Logger
	// Interval is how often the holder looks for its interface until it
	// appears, and then checks its record is still in place (0: 1s, 30s).
	Interval time.Duration
}

// NewHolder returns a holder that finds its interface in stack (its own
// namespace) and its namespace's identity with self.
func NewHolder(stack Stack, self func() (NSID, error), store RecordStore, log logr.Logger) *Holder {
	return &Holder{stack: stack, self: self, store: store, log: log}
}

// Run publishes rec (pod and interface; the PID and namespace are filled
// in) once the interface exists, keeps it published until ctx ends, then
// withdraws it: a deleted holder pod takes its network with it.
func (h *Holder) Run(ctx context.Context, rec Record) error {
	wait, check := h.Interval, h.Interval
	if wait <= 0 {
		wait, check = time.Second, 30*time.Second
	}
	for logged := false; ; logged = true {
		_, err := h.stack.Link(rec.Interface)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNoLink) {
			return err
		}
		if !logged {
			h.log.Info("waiting for the storage network interface", "interface", rec.Interface)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	id, err := h.self()
	if err != nil {
		return fmt.Errorf("own network namespace: %w", err)
	}
	rec.NetNS, rec.PID = id, os.Getpid()
	if err := h.store.Write(rec); err != nil {
		return err
	}
	h.log.Info("holding the storage network interface", "interface", rec.Interface, "netns", rec.NetNS)
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := h.store.Remove(rec.PodUID); err != nil {
				return fmt.Errorf("withdraw holder record: %w", err)
			}
			h.log.Info("holder stopped: record withdrawn, the mover removes this pod's copy")
			return nil
		case <-t.C:
			// A node cleanup may have emptied the folder: put the record back.
			if got, err := h.store.Read(rec.PodUID); err != nil || got != rec {
				if err := h.store.Write(rec); err != nil {
					h.log.Error(err, "rewrite holder record")
				}
			}
		}
	}
}
