package testenv

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// AgentVolume makes vol for the agent under test and waits until the
// agent made its image (WaitVolumeAvailable). When the test ends it
// deletes vol and waits, 10 s at the most, until the agent removed it, so
// that no image outlives its test.
func (e *Env) AgentVolume(t testing.TB, vol *v1.Volume) {
	t.Helper()
	ctx := context.Background()
	if err := e.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.Client.Delete(ctx, vol)
		for range 100 {
			if err := e.Client.Get(ctx, client.ObjectKeyFromObject(vol), vol); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("volume %s not deleted by the agent", vol.Name)
	})
	e.WaitVolumeAvailable(t, vol)
}

// WaitVolumeAvailable waits until the agent made vol's image (its state
// Available), 30 s at the most, and leaves vol as read last.
func (e *Env) WaitVolumeAvailable(t testing.TB, vol *v1.Volume) {
	t.Helper()
	for i := 0; ; i++ {
		if err := e.Client.Get(context.Background(), client.ObjectKeyFromObject(vol), vol); err == nil && vol.Status.State == v1.VolumeAvailable {
			return
		}
		if i == 300 {
			t.Fatalf("volume %s not made by the agent: %+v", vol.Name, vol.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// KernelLog returns the kernel log lines (dmesg), for checking that a test
// caused no I/O error on its devices; nil, logged, where it cannot be read.
func KernelLog(t testing.TB) []string {
	t.Helper()
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		t.Logf("dmesg: %v (kernel log not checked)", err)
		return nil
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// LoopsOf lists the loop devices over image, as losetup -j finds them (by
// the file's device and inode, whatever path attached it).
func LoopsOf(t testing.TB, image string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "-j", image, "-n", "-O", "NAME").Output()
	if err != nil {
		t.Fatalf("losetup -j %s: %v", image, err)
	}
	return strings.Fields(string(out))
}

// WriteSynced writes data to the file name and fsyncs it, so that it is on
// the volume's device, not only in the page cache.
func WriteSynced(t testing.TB, name string, data []byte) {
	t.Helper()
	fh, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(data); err != nil {
		_ = fh.Close()
		t.Fatalf("write %s: %v", name, err)
	}
	if err := fh.Sync(); err != nil {
		_ = fh.Close()
		t.Fatalf("fsync %s: %v", name, err)
	}
	if err := fh.Close(); err != nil {
		t.Fatalf("close %s: %v", name, err)
	}
}
