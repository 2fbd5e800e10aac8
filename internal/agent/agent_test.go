package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	mountutils "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/berth-io/berth/internal/blockdev/launch"
	"github.com/berth-io/berth/internal/mount"
	"github.com/berth-io/berth/internal/scheme"
)

// newTestAgent is New with fakes for the required parts c leaves out, and
// with a server launcher that fails the test, for unit tests of one part.
func newTestAgent(t *testing.T, c Config) *Agent {
	t.Helper()
	if c.Node == "" {
		c.Node = "node-a"
	}
	if c.API == nil {
		c.API = fakeAPI(t).Build()
	}
	if c.Images == nil {
		c.Images = fakeImages{}
	}
	if c.Loop == nil {
		c.Loop = &fakeLoop{devs: map[string]string{}}
	}
	if c.Mounts == nil {
		c.Mounts = mount.NewManager(mountutils.NewFakeMounter(nil), &testingexec.FakeExec{}, logr.Discard())
	}
	if c.Fence == nil {
		c.Fence = &fakeFence{holds: map[string]bool{}}
	}
	if c.Userspace != nil && c.Userspace.Start == nil {
		us := *c.Userspace
		us.Start = func(_ context.Context, p launch.Params) (Server, error) {
			t.Errorf("this test starts no blockdev server, but one was started for %s", p.Volume)
			return nil, errors.New("no blockdev servers in this test")
		}
		c.Userspace = &us
	}
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// fakeAPI is a fake API server client builder that knows berth's types and
// holds objs.
func fakeAPI(t *testing.T, objs ...client.Object) *fake.ClientBuilder {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...)
}

func TestNewRefusesBadConfig(t *testing.T) {
	good := func() Config {
		return Config{Node: "node-a", API: fake.NewClientBuilder().Build(), Images: fakeImages{}, Loop: &fakeLoop{},
			Mounts: mount.NewManager(mountutils.NewFakeMounter(nil), &testingexec.FakeExec{}, logr.Discard()), Fence: &fakeFence{}}
	}
	us := func(f func(*UserspaceConfig)) func(*Config) {
		return func(c *Config) {
			u := UserspaceConfig{Root: "/run/berth/blockdev", Keeper: &hostKeeper{},
				Start: func(context.Context, launch.Params) (Server, error) { return nil, nil }}
			f(&u)
			c.Userspace = &u
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"empty", func(c *Config) { *c = Config{} }, []string{"Node is empty", "API is nil", "Images is nil", "Loop is nil", "Mounts is nil", "Fence is nil"}},
		{"negative lock wait", func(c *Config) { c.LockWait = -time.Second }, []string{"LockWait -1s"}},
		{"relative flex root", func(c *Config) { c.Flex = FlexConfig{StagingRoot: "flex", Holdings: nil} }, []string{`"flex" is not an absolute path`, "both StagingRoot and Holdings"}},
		{"userspace relative root", us(func(u *UserspaceConfig) { u.Root = "blockdev" }), []string{`Userspace: Root "blockdev"`}},
		{"userspace without keeper and launcher", us(func(u *UserspaceConfig) { u.Keeper, u.Start = nil, nil }), []string{"Keeper is nil", "Start is nil"}},
		{"userspace nbd without driver", us(func(u *UserspaceConfig) { u.Transport = TransportNBD }), []string{"Transport nbd needs NBD"}},
		{"userspace unknown transport", us(func(u *UserspaceConfig) { u.Transport = "iscsi" }), []string{`"iscsi"`}},
		{"userspace negative timeout", us(func(u *UserspaceConfig) { u.StopTimeout = -1 }), []string{"negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(&c)
			a, err := New(c)
			if a != nil || !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v, %v; want ErrConfig", a, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	a := newTestAgent(t, Config{Userspace: &UserspaceConfig{Root: t.TempDir(), Keeper: &hostKeeper{}}})
	if a.Locks() == nil || a.lockWait != DefaultLockWait {
		t.Errorf("locks %v, lock wait %v; want new locks and %v", a.Locks(), a.lockWait, DefaultLockWait)
	}
	if a.us.StopTimeout != 10*time.Second || a.us.FUSEMounted == nil {
		t.Errorf("userspace defaults not filled in: stop timeout %v, FUSEMounted set %t", a.us.StopTimeout, a.us.FUSEMounted != nil)
	}
	if ok, reason := a.us.NBD.Available(); ok || reason == "" {
		t.Errorf("an agent given no nbd driver has nbd: %t %q", ok, reason)
	}
}
