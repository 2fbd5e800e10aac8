package storagecluster

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzNADConfig: the operator reads a NetworkAttachmentDefinition's
// spec.config (CNI JSON, written by whoever may edit definitions in that
// namespace) and puts what it found in the StorageCluster's NetworkReady
// condition and an Event. Whatever the config, the finding's message is
// short and valid UTF-8: a condition message over 32768 bytes, or one the API
// refuses, would keep the whole status from being written. Seeds are the
// e2e cluster's definitions (hack/cluster/multus.sh) and the tests'.
func FuzzNADConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion": "0.4.0", "type": "macvlan", "master": "eth1", "mode": "bridge", "ipam": {"type": "whereabouts", "range": "192.168.20.0/24", "range_start": "192.168.20.10", "configuration_path": "/etc/cni/net.d/whereabouts.d/whereabouts.conf"}}`,
		`{"cniVersion":"0.3.1","type":"macvlan","master":"eth1"}`,
		`{"cniVersion":"0.3.1","name":"public","plugins":[{"type":"macvlan","master":"eth1","ipam":{"type":"host-local","range":"192.168.20.0/24"}},{"type":"tuning"}]}`,
		``, `not json`,
		// A type name longer than a condition message may be.
		`{"type":"` + strings.Repeat("macvlan", 5000) + `","ipam":{"type":"host-local"}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, config string) {
		got := configFinding(config)
		if len(got.message) > 1024 || !utf8.ValidString(got.message) {
			t.Fatalf("configFinding(%d bytes) message of %d bytes (valid UTF-8: %t)", len(config), len(got.message), utf8.ValidString(got.message))
		}
		if got.message == "" {
			t.Fatalf("configFinding(%q): no message", config)
		}
	})
}
