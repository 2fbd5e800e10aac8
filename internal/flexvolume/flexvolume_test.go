package flexvolume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseMount(t *testing.T) {
	r, err := ParseMount([]string{"/var/lib/kubelet/pods/0b5e7c2a-1111/volumes/berth.io~berth/data",
		`{"kubernetes.io/fsType":"xfs","kubernetes.io/readwrite":"ro","kubernetes.io/pod.name":"web","kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"0b5e7c2a-1111","kubernetes.io/pvOrVolumeName":"pv-1","size":"1Gi"}`})
	if err != nil {
		t.Fatal(err)
	}
	want := MountRequest{MountDir: "/var/lib/kubelet/pods/0b5e7c2a-1111/volumes/berth.io~berth/data", Volume: "pv-1", PVOrVolumeName: "pv-1", FSType: "xfs", ReadOnly: true,
		PodNamespace: "default", PodName: "web", PodUID: "0b5e7c2a-1111"}
	if r != want {
		t.Errorf("got %+v\nwant %+v", r, want)
	}
	r, err = ParseMount([]string{"/m", `{"volume":"vol-a","kubernetes.io/pvOrVolumeName":"data"}`})
	if err != nil || r.Volume != "vol-a" || r.PVOrVolumeName != "data" {
		t.Errorf("berth's volume option: %+v %v", r, err)
	}
	for name, args := range map[string][]string{
		"no args":      nil,
		"relative dir": {"m", `{"volume":"a"}`},
		"bad json":     {"/m", `{`},
		"no volume":    {"/m", `{}`},
		"bad rw":       {"/m", `{"volume":"a","kubernetes.io/readwrite":"maybe"}`},
		"not strings":  {"/m", `{"volume":1}`},
	} {
		if _, err := ParseMount(args); !errors.Is(err, ErrUsage) {
			t.Errorf("%s: err = %v, want a usage error", name, err)
		}
	}
}

// The driver is berth's static build beside it when there is one: kubelet
// runs it on the host, which may lack the Ceph libraries berth links.
func TestDriverBinaryPrefersTheStaticBuild(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "berth")
	if got := DriverBinary(self); got != self {
		t.Errorf("without a static build: %s, want %s", got, self)
	}
	if err := os.Mkdir(filepath.Join(dir, StaticBinary), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := DriverBinary(self); got != self {
		t.Errorf("a folder named %s: %s, want %s", StaticBinary, got, self)
	}
	other := t.TempDir()
	self = filepath.Join(other, "berth")
	static := filepath.Join(other, StaticBinary)
	if err := os.WriteFile(static, []byte("stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := DriverBinary(self); got != static {
		t.Errorf("with a static build: %s, want %s", got, static)
	}
}
