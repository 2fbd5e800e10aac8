package rbdimage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const key = "AQBkeykeykeykeykeykeykeykeykeykeykeyk=="

func TestAccessFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vol.json")
	a := Access{MonHost: "[v2:127.0.0.1:3300]", Client: "berth", Key: key, Pool: "rbd", Image: "berth-vol"}
	if err := Write(path, a); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("access file %v, %v; want 0600", st, err)
	}
	if got, err := Read(path); err != nil || got != a {
		t.Fatalf("Read = %+v, %v", got, err)
	}
	if strings.Contains(a.String(), key) {
		t.Errorf("String shows the key: %s", a)
	}
	if Spec(path) != "rbd:"+path {
		t.Errorf("Spec = %q", Spec(path))
	}
	a.Key = ""
	if err := Write(filepath.Join(t.TempDir(), "x.json"), a); err == nil || !strings.Contains(err.Error(), "key") {
		t.Errorf("Write without a key: %v", err)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v", err)
	}
}

func TestCause(t *testing.T) {
	for msg, want := range map[string]error{
		"server failed: connect to ceph monitors [v2:1.2.3.4:3300] as client.berth: " + ErrRefused.Error() + ": rados: ret=-13": ErrRefused,
		"connect: " + ErrUnreachable.Error() + " (10s): rados: ret=-110":                                                        ErrUnreachable,
		"server exited before it was ready":                                                                                     nil,
	} {
		if got := Cause(msg); got != want {
			t.Errorf("Cause(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestClientsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vol.json")
	if got, err := ReadClients(path); err != nil || got != nil {
		t.Fatalf("no server yet: ReadClients = %v, %v; want none", got, err)
	}
	for _, addrs := range [][]string{{"10.0.0.1:0/111"}, {"10.0.0.2:0/222", "[::1]:0/222"}} {
		if err := writeClients(path, addrs); err != nil {
			t.Fatal(err)
		}
		got, err := ReadClients(path)
		if err != nil || strings.Join(got, ",") != strings.Join(addrs, ",") {
			t.Fatalf("ReadClients = %v, %v; want the last server's %v", got, err, addrs)
		}
	}
	if ClientsPath(path) == path || filepath.Ext(ClientsPath(path)) == ".json" {
		t.Errorf("ClientsPath %s may meet an access file", ClientsPath(path))
	}
}
