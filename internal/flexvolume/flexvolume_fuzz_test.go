package flexvolume

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// FuzzParseMount feeds ParseMount what kubelet could pass (a mount dir and
// the options JSON). Seeds are kubelet's real calls: a PV, an inline volume
// with berth's option, and read-only.
func FuzzParseMount(f *testing.F) {
	f.Add("/var/lib/kubelet/pods/0b5e7c2a-63a8-4b8e-9bde-7e6f3f6c1111/volumes/berth.io~berth/pv-1",
		`{"kubernetes.io/fsType":"ext4","kubernetes.io/pod.name":"web-0","kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"0b5e7c2a-63a8-4b8e-9bde-7e6f3f6c1111","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw","kubernetes.io/serviceAccount.name":"default"}`)
	f.Add("/var/lib/kubelet/pods/8d1c/volumes/berth.io~berth/data",
		`{"kubernetes.io/fsType":"","kubernetes.io/pod.name":"writer","kubernetes.io/pod.namespace":"team-a","kubernetes.io/pod.uid":"8d1c","kubernetes.io/pvOrVolumeName":"data","kubernetes.io/readwrite":"ro","volume":"vol-a"}`)
	f.Add("/m", `{"volume":"a","kubernetes.io/readwrite":"maybe"}`)
	f.Add("m/../x", `{"volume":1}`)
	f.Add("/m", `{"volume":"a","volume":"b"}`)
	f.Add("/m\xff", `{"volume":"a"}`)
	f.Fuzz(func(t *testing.T, dir, opts string) {
		r, err := ParseMount([]string{dir, opts})
		if err != nil {
			if !errors.Is(err, ErrUsage) {
				t.Fatalf("error %v is not a usage error", err)
			}
			if r != (MountRequest{}) {
				t.Fatalf("a refused call returned %+v", r)
			}
			return
		}
		// Passed on as kubelet gave it: the agent refuses one not clean.
		if !filepath.IsAbs(r.MountDir) || r.MountDir != dir || !utf8.ValidString(r.MountDir) {
			t.Fatalf("mount dir %q is not the absolute UTF-8 %q given", r.MountDir, dir)
		}
		if r.Volume == "" {
			t.Fatal("accepted without a volume")
		}
		var m map[string]string
		if err := json.Unmarshal([]byte(opts), &m); err != nil {
			t.Fatalf("accepted options that are not a JSON object of strings: %v", err)
		}
		if r.ReadOnly != (m[OptReadWrite] == "ro") || r.FSType != m[OptFSType] || r.PodUID != m[OptPodUID] {
			t.Fatalf("%+v does not say what the options say: %v", r, m)
		}
		// What berth understood, written back as options, parses the same.
		back := map[string]string{OptVolume: r.Volume, OptVolumeName: r.PVOrVolumeName, OptFSType: r.FSType,
			OptPodNamespace: r.PodNamespace, OptPodName: r.PodName, OptPodUID: r.PodUID, OptServiceAccount: r.ServiceAccount, OptReadWrite: "rw"}
		if r.ReadOnly {
			back[OptReadWrite] = "ro"
		}
		b, _ := json.Marshal(back)
		again, err := ParseMount([]string{r.MountDir, string(b)})
		if err != nil || again != r {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, r)
		}
	})
}
