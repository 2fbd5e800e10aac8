package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-io/berth/internal/version"
)

// NewBuildInfo registers berth_build_info: 1, labelled with the build's
// version, commit, Go version and whether it has the ceph backend. An
// alert or a dashboard joins it to see which build a process runs, as
// during an upgrade two do.
func NewBuildInfo(reg prometheus.Registerer, v version.Info) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "1, labelled with the version, commit and Go version of the berth binary serving these metrics, and ceph: whether it has the ceph backend.",
		ConstLabels: prometheus.Labels{
			"version": v.Version, "commit": v.Commit, "goversion": v.GoVersion, "ceph": strconv.FormatBool(v.Ceph),
		},
	})
	g.Set(1)
	return register(reg, "build", g)
}
