package image

import (
	"os"
	"os/exec"
	"testing"
)

// TestContainerfileBuild builds the image from the Containerfile with
// buildah, without a network, and checks it against make image's: the same
// paths, entrypoint and `berth version` (hack/containerfile-build.sh). It
// runs where buildah is installed, or with BERTH_CONTAINERFILE_BUILD=1,
// which installs it; BERTH_CONTAINERFILE_BUILD=0 leaves it out.
func TestContainerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two images: not with -short")
	}
	switch os.Getenv("BERTH_CONTAINERFILE_BUILD") {
	case "0":
		t.Skip("BERTH_CONTAINERFILE_BUILD=0")
	case "1":
	default:
		if _, err := exec.LookPath("buildah"); err != nil {
			t.Skip("needs buildah (apt-get install buildah), or BERTH_CONTAINERFILE_BUILD=1, which installs it")
		}
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
