package dev

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// ClusterEnv is the KEY=value content of the cluster.env that
// hack/cluster/up.sh writes.
type ClusterEnv map[string]string

// ReadClusterEnv reads the KEY=value lines of path (comments skipped).
func ReadClusterEnv(path string) (ClusterEnv, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open cluster env: %w", err)
	}
	defer func() { _ = f.Close() }()
	env := ClusterEnv{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			// A value with spaces is quoted, so that the file stays sourceable.
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			env[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return env, nil
}

// LoadClusterEnv reads path and checks the keys `berth dev` uses.
func LoadClusterEnv(path string) (ClusterEnv, error) {
	env, err := ReadClusterEnv(path)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"KUBECONFIG", "KUBECTL", "KUBELET_ROOT", "VOLUME_PLUGIN_DIR", "BERTH_E2E_DIR", "BERTH_DATA_DIR"} {
		if env[k] == "" {
			return nil, fmt.Errorf("%s lacks %s", path, k)
		}
	}
	return env, nil
}
