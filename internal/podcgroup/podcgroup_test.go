package podcgroup

import "testing"

func TestPodUID(t *testing.T) {
	const uid = "8d3f4a2e-1b2c-4d5e-8f90-0a1b2c3d4e5f"
	for in, want := range map[string]string{
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8d3f4a2e_1b2c_4d5e_8f90_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n": uid,
		"12:memory:/kubepods/burstable/pod" + uid + "/0123abcd\n0::/\n":                                                                             uid,
		"0::/../../kubepods-pod8d3f4a2e_1b2c_4d5e_8f90_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n":                                               uid,
		"0::/system.slice/containerd.service\n":                                                                                                     "",
		"0::/user.slice/pod" + uid + "\n":                                                                                                           "",
	} {
		if got := PodUID(in); got != want {
			t.Errorf("PodUID(%q) = %q, want %q", in, got, want)
		}
	}
}
