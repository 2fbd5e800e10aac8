package dev

import (
	"bytes"
	_ "embed"
	"fmt"
	"path/filepath"
	"text/template"
)

// Namespace holds berth's driver pods.
const Namespace = "berth-system"

// Images of the CSI sidecars, as hack/cluster/images.sh tags them.
const (
	ProvisionerImage = "berth.local/csi-provisioner:v5.3.0"
	ResizerImage     = "berth.local/csi-resizer:v1.14.0"
	SnapshotterImage = "berth.local/csi-snapshotter:v8.3.0"
)

//go:embed berth.yaml.tmpl
var berthManifests string

var manifestTemplate = template.Must(template.New("berth").Option("missingkey=error").Parse(berthManifests))

// manifestValues fill berth.yaml.tmpl.
type manifestValues struct {
	Namespace, BerthImage, ProvisionerImage, ResizerImage string
	KubeletRoot, VolumePluginDir, DataDir, RunDir         string
}

// Manifests renders berth's install for the cluster of env.
func Manifests(env ClusterEnv) ([]byte, error) {
	if env["BERTH_IMAGE"] == "" {
		return nil, fmt.Errorf("cluster.env has no BERTH_IMAGE: the berth image was not imported")
	}
	v := manifestValues{
		Namespace: Namespace, BerthImage: env["BERTH_IMAGE"],
		ProvisionerImage: ProvisionerImage, ResizerImage: ResizerImage,
		KubeletRoot: env["KUBELET_ROOT"], VolumePluginDir: env["VOLUME_PLUGIN_DIR"],
		// Under the cluster's folder, so that down.sh finds their mounts and loops.
		DataDir: filepath.Join(env["BERTH_E2E_DIR"], "berth-data"),
		RunDir:  filepath.Join(env["BERTH_E2E_DIR"], "berth-run"),
	}
	var b bytes.Buffer
	if err := manifestTemplate.Execute(&b, v); err != nil {
		return nil, fmt.Errorf("render berth manifests: %w", err)
	}
	return b.Bytes(), nil
}
