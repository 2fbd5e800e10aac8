package nfsclient

import "testing"

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]Endpoint{
		"nfs://10.0.0.5/pv1":           {Addr: "10.0.0.5:2049", Export: "/pv1"},
		"nfs://share-pv1:20490/pv1/":   {Addr: "share-pv1:20490", Export: "/pv1"},
		"nfs://[fd00::1]:2049/a/b":     {Addr: "[fd00::1]:2049", Export: "/a/b"},
		"nfs://svc.ns.svc/pvc-1234abc": {Addr: "svc.ns.svc:2049", Export: "/pvc-1234abc"},
	} {
		got, err := ParseEndpoint(in)
		if err != nil || got != want {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "http://h/x", "nfs://h", "nfs://h/", "nfs:///x", "nfs://u@h/x", "nfs://h/x?y=1", "nfs://h/../x"} {
		if _, err := ParseEndpoint(bad); err == nil {
			t.Errorf("ParseEndpoint(%q) succeeded", bad)
		}
	}
}

func TestPathStaysInsideTheExport(t *testing.T) {
	ep := Endpoint{Addr: "h:2049", Export: "/pv1"}
	if p, err := ep.path("a/b.bin"); err != nil || p != "/pv1/a/b.bin" {
		t.Errorf("path = %q, %v", p, err)
	}
	for _, bad := range []string{"", "/etc/passwd", "..", "../x", "."} {
		if _, err := ep.path(bad); err == nil {
			t.Errorf("path(%q) succeeded", bad)
		}
	}
}
