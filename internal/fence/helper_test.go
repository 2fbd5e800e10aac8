package fence_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Environment of a contender process: the test binary runs itself.
const (
	helperEnv        = "BERTH_FENCE_HELPER"
	helperKubeconfig = "BERTH_FENCE_KUBECONFIG"
	helperID         = "BERTH_FENCE_ID"
	helperPrefix     = "BERTH_FENCE_PREFIX"
)

// helperMain is one contender process. It answers line commands on stdin:
// "try N" (the first N volumes) -> "held 101" (one digit per volume) or "error ...";
// "release" -> "ok" or "error ..."; "injected" -> "injected N".
func helperMain() int {
	id, err := strconv.Atoi(os.Getenv(helperID))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: bad id:", err)
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(helperKubeconfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	l, err := newLocal(cfg, id, os.Getenv(helperPrefix))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	ctx := context.Background()
	in, out := bufio.NewScanner(os.Stdin), bufio.NewWriter(os.Stdout)
	for in.Scan() {
		var reply string
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "try":
			n, _ := strconv.Atoi(arg)
			held, err := l.try(ctx, n)
			reply = "held " + digits(held)
			if err != nil {
				reply = "error " + oneLine(err)
			}
		case "release":
			reply = "ok"
			if err := l.release(ctx); err != nil {
				reply = "error " + oneLine(err)
			}
		case "injected":
			reply = fmt.Sprintf("injected %d", l.in.n.Load())
		default:
			reply = "error unknown command " + in.Text()
		}
		fmt.Fprintln(out, reply)
		if err := out.Flush(); err != nil {
			return 1
		}
	}
	return 0
}

func digits(held []bool) string {
	var b strings.Builder
	for _, h := range held {
		if h {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	return b.String()
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " | ") }

// proc is a contender in a separate process.
type proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startProc(kubeconfig string, id int, prefix string) (*proc, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperKubeconfig+"="+kubeconfig,
		helperID+"="+strconv.Itoa(id), helperPrefix+"="+prefix)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start contender process %d: %w", id, err)
	}
	return &proc{cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

func (p *proc) call(cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return "", fmt.Errorf("process %d: %w", p.cmd.Process.Pid, err)
	}
	if !p.out.Scan() {
		return "", fmt.Errorf("process %d: no answer to %q: %w", p.cmd.Process.Pid, cmd, p.out.Err())
	}
	reply := p.out.Text()
	if msg, ok := strings.CutPrefix(reply, "error "); ok {
		return "", fmt.Errorf("process %d: %s", p.cmd.Process.Pid, msg)
	}
	return reply, nil
}

func (p *proc) try(_ context.Context, nvols int) ([]bool, error) {
	reply, err := p.call("try " + strconv.Itoa(nvols))
	if err != nil {
		return nil, err
	}
	var held []bool
	for _, c := range strings.TrimPrefix(reply, "held ") {
		held = append(held, c == '1')
	}
	return held, nil
}

func (p *proc) release(context.Context) error {
	_, err := p.call("release")
	return err
}

func (p *proc) injected() (int64, error) {
	reply, err := p.call("injected")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimPrefix(reply, "injected "), 10, 64)
}

// close ends the process: EOF on stdin, then a kill of its PID if it lingers.
func (p *proc) close() error {
	_ = p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("process %d did not exit; killed: %w", p.cmd.Process.Pid, <-done)
	}
}

// writeKubeconfig writes cfg (envtest's admin client certificate) to dir.
func writeKubeconfig(cfg *rest.Config, dir string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}
