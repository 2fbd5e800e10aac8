package userspace

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/berth-io/berth/internal/keeper"
)

// apiCut is a TCP proxy to the API server on 127.0.0.1 that can cut every
// connection and refuse new ones, as a control plane gone away would.
type apiCut struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func newAPICut(t *testing.T, target string) *apiCut {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiCut{l: l, target: target}
	t.Cleanup(func() { _ = l.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *apiCut) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		p.mu.Lock()
		if err != nil || p.cut {
			p.mu.Unlock()
			_ = c.Close()
			if up != nil {
				_ = up.Close()
			}
			continue
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
	}
}

// setCut cuts (closing every connection) or lets connections through again.
func (p *apiCut) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// proxiedAPI returns a proxy to the fixture's API server and a kubeconfig
// that reaches the API server through it.
func (f *fixture) proxiedAPI(t *testing.T) (*apiCut, string) {
	t.Helper()
	cfg, err := os.ReadFile(f.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	server := regexp.MustCompile(`server: https://([^\s/]+)`).FindSubmatch(cfg)
	if server == nil {
		t.Fatalf("no server line in the kubeconfig:\n%s", cfg)
	}
	p := newAPICut(t, string(server[1]))
	proxied := filepath.Join(t.TempDir(), "kubeconfig-proxied")
	if err := os.WriteFile(proxied, []byte(strings.Replace(string(cfg), string(server[0]), "server: https://"+p.l.Addr().String(), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, proxied
}

// agentLogSize is how long the agent's log is now (the log is the whole
// suite's): waitAgentLog then reads only what comes after.
func (f *fixture) agentLogSize(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(f.agentLog)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// waitAgentLog waits until the agent's log holds want after its first
// since bytes.
func (f *fixture) waitAgentLog(t *testing.T, want string, since int64, limit time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; {
		log, err := os.ReadFile(f.agentLog)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(log)) > since && strings.Contains(string(log[since:]), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent log does not say %q:\n%s", want, tail(string(log), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHealWhileAPIServerAway: the agent runs, the API server goes away
// (every connection cut), and a volume's blockdev server dies. The
// healer heals the volumes its own records name whose images are files
// here before it lists this node's Attachments, which fails: the
// verifying writer goes on without an error. The API server comes back and the
// agent goes on as before.
func TestHealWhileAPIServerAway(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolume(t, nc, "heal-noapi")
	w := startWriter(t, m, 11)

	p, proxied := f.proxiedAPI(t)
	// The agent through the proxy (its blockdev server lives on).
	f.killAgent()
	if err := f.startAgent("--kubeconfig", proxied); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	time.Sleep(3 * time.Second) // its first passes, with the API server there

	p.setCut(true)
	ctx := context.Background()
	vols, err := keeper.NewClient(f.keeperSock).List(ctx)
	if err != nil || len(vols) != 1 || vols[0].ServerPID == 0 {
		t.Fatalf("keeper: %+v, %v; want one volume with a live server", vols, err)
	}
	logged := f.agentLogSize(t)
	killed := time.Now()
	if err := killWait(vols[0].ServerPID); err != nil {
		t.Fatal(err)
	}
	w.waitWrite(t, killed, 60*time.Second)
	t.Logf("first write %s after the server was killed, the API server away", time.Since(killed).Round(time.Millisecond))
	// The heal is logged once its Volume was read, from the agent's cache.
	f.waitAgentLog(t, "healed: a new blockdev server took over", logged, 20*time.Second)

	p.setCut(false)
	f.verifyWithDirectAgent(t, nc, w, m)
}

// verifyWithDirectAgent restarts the agent without the proxy (the
// fixture's cleanup unstages through it), then stops the writer, which
// verifies every block, and reads and writes the volume.
func (f *fixture) verifyWithDirectAgent(t *testing.T, nc csi.NodeClient, w *writer, m mounted) {
	t.Helper()
	f.killAgent()
	if err := f.startAgent(); err != nil {
		t.Fatal(err)
	}
	waitCSI(t, nc)
	if err := w.Stop(30 * time.Second); err != nil {
		t.Errorf("writer: %v", err)
	}
	checkReadWrite(t, []mounted{m})
}

// TestAgentStartedWhileAPIServerAwayHeals: the agent and every blockdev
// server are killed, and the agent starts again while the API server is
// away (every connection refused): it is built without the API server
// (berth's kinds need no discovery) and heals the volumes staged here
// whose images are files here, so the verifying writer goes on without an
// error. Once the API server is back, its controllers start and it runs
// on.
func TestAgentStartedWhileAPIServerAwayHeals(t *testing.T) {
	f := setup(t)
	nc := f.node(t)
	m := f.userspaceVolume(t, nc, "start-noapi")
	w := startWriter(t, m, 12)
	p, proxied := f.proxiedAPI(t)

	p.setCut(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := f.killAll(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	logged := f.agentLogSize(t)
	killed := time.Now()
	if err := f.startAgent("--kubeconfig", proxied); err != nil {
		t.Fatal(err)
	}
	w.waitWrite(t, killed, 60*time.Second)
	t.Logf("first write %s after the agent started, the API server away", time.Since(killed).Round(time.Millisecond))
	f.waitAgentLog(t, "healed: a new blockdev server took over", logged, 20*time.Second)

	// The API server back, the agent's caches fill and its controllers
	// start (they would give up, and the agent exit, two minutes after
	// its start).
	p.setCut(false)
	f.waitAgentLog(t, `"msg":"Starting workers","controller":"volume"`, logged, 90*time.Second)
	select {
	case <-f.agentDone:
		log, _ := os.ReadFile(f.agentLog)
		t.Fatalf("the agent exited:\n%s", tail(string(log), 4000))
	default:
	}
	f.verifyWithDirectAgent(t, nc, w, m)
}
