package share

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func validExport() ExportConfig {
	return ExportConfig{Path: "/export", Pseudo: "/pv1", RecoveryRoot: "/export/.rec", BindAddr: "127.0.0.1", Port: 20490, SyncWrites: true}
}

func TestRenderHasWhatFailoverNeeds(t *testing.T) {
	conf, err := validExport().Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Minor_Versions = 1, 2;",
		"Lease_Lifetime = 15;",
		"Grace_Period = 15;",
		"RecoveryBackend = fs;",
		`RecoveryRoot = "/export/.rec";`,
		`Plugins_Dir = "/usr/lib/x86_64-linux-gnu/ganesha";`,
		"Name = VFS;",
		`Path = "/export";`,
		`Pseudo = "/pv1";`,
		"NFS_Port = 20490;",
		"Bind_addr = 127.0.0.1;",
		"NFS_Commit = true;",
		"Clustered = false;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
}

func TestRenderMinorVersionsSortedOnce(t *testing.T) {
	c := validExport()
	c.MinorVersions = []int{2, 0, 1, 2}
	conf, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, "Minor_Versions = 0, 1, 2;") {
		t.Errorf("got:\n%s", conf)
	}
}

func TestRenderRefusesBadInput(t *testing.T) {
	for name, mutate := range map[string]func(*ExportConfig){
		"relative path":       func(c *ExportConfig) { c.Path = "export" },
		"quote in path":       func(c *ExportConfig) { c.Path = `/ex"port` },
		"pseudo root":         func(c *ExportConfig) { c.Pseudo = "/" },
		"unclean recovery":    func(c *ExportConfig) { c.RecoveryRoot = "/a/../b" },
		"bind not an IP":      func(c *ExportConfig) { c.BindAddr = "localhost" },
		"port":                func(c *ExportConfig) { c.Port = 70000 },
		"lease too long":      func(c *ExportConfig) { c.LeaseLifetime = 121 * time.Second },
		"grace not seconds":   func(c *ExportConfig) { c.GracePeriod = 1500 * time.Millisecond },
		"minor version three": func(c *ExportConfig) { c.MinorVersions = []int{3} },
		"grace below lease":   func(c *ExportConfig) { c.LeaseLifetime, c.GracePeriod = 20*time.Second, 10*time.Second },
	} {
		t.Run(name, func(t *testing.T) {
			c := validExport()
			mutate(&c)
			if _, err := c.Render(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Render() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestLocalEndpoint(t *testing.T) {
	c := validExport()
	c.BindAddr = "0.0.0.0"
	if got := c.LocalEndpoint(); got != "127.0.0.1:20490" {
		t.Errorf("LocalEndpoint() = %s", got)
	}
	c.BindAddr = "10.1.2.3"
	if got := c.LocalEndpoint(); got != "10.1.2.3:20490" {
		t.Errorf("LocalEndpoint() = %s", got)
	}
}

func TestRenderAdmitsOnlyListedClients(t *testing.T) {
	c := validExport()
	c.Clients = []string{"10.0.0.7", "fd00::2", "10.1.0.0/16", "10.0.0.7", "::ffff:10.0.0.8"}
	conf, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Access_Type = None;",
		"Clients = 10.0.0.7, 10.0.0.8, 10.1.0.0/16, 127.0.0.1, fd00::2;",
		"Access_Type = RW;",
		"Squash = No_Root_Squash;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	c.RootSquash = true
	if conf, _ := c.Render(); !strings.Contains(conf, "Squash = Root_Squash;") {
		t.Errorf("root squash not rendered:\n%s", conf)
	}
	for _, bad := range []string{"host.example", "*", "@netgroup", "10.0.0.1;", "fe80::1%eth0", ""} {
		c := validExport()
		c.Clients = []string{bad}
		if _, err := c.Render(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("client %q: Render() = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
