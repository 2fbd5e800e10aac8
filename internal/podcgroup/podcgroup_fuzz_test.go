package podcgroup

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// uidPattern is a pod UID as unstage names it to the user.
var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// FuzzPodUID: unstage names the pods whose processes hold a
// volume open from their /proc/<pid>/cgroup, which any process on the
// node can shape by its cgroup names. Whatever the file says, the answer
// is "" or a pod UID that the file holds after "kubepods" (with the
// systemd driver's underscores as dashes). Seeds are this machine's own
// cgroup file and kubelet's cgroupfs and systemd layouts.
func FuzzPodUID(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		f.Add(string(b))
	}
	for _, s := range []string{
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8d3f4a2e_1b2c_4d5e_8f90_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n",
		"12:memory:/kubepods/burstable/pod8d3f4a2e-1b2c-4d5e-8f90-0a1b2c3d4e5f/0123abcd\n0::/\n",
		"0::/user.slice/pod8d3f4a2e-1b2c-4d5e-8f90-0a1b2c3d4e5f\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cgroup string) {
		uid := PodUID(cgroup)
		if uid == "" {
			return
		}
		i := strings.Index(cgroup, "kubepods")
		if !uidPattern.MatchString(uid) || i < 0 || !strings.Contains(strings.ReplaceAll(cgroup[i:], "_", "-"), uid) {
			t.Fatalf("PodUID(%q) = %q", cgroup, uid)
		}
	})
}
