package image

import (
	"os"
	"os/exec"
	"testing"
)

// TestContainerfileBuild builds the image from the Containerfile with
// buildah, without a network, and checks it against make image's: the same
// paths, entrypoint and `berth version` (hack/containerfile-build.sh). It
// runs only with BERTH_CONTAINERFILE_BUILD=1 (make
// image-containerfile-check): making its base images fetches Debian
// packages, which no test of `make test` may, and a cold run takes ~5 min.
func TestContainerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two images: not with -short")
	}
	if os.Getenv("BERTH_CONTAINERFILE_BUILD") != "1" {
		t.Skip("builds images from Debian's packages: set BERTH_CONTAINERFILE_BUILD=1 (make image-containerfile-check)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mmdebstrap and buildah's storage")
	}
	cmd := exec.Command("../../hack/containerfile-build.sh")
	out, err := cmd.CombinedOutput()
	t.Logf("hack/containerfile-build.sh:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
