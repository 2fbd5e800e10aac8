package agent

import (
	"os"
	"testing"

	"github.com/berth-io/berth/internal/testenv"
)

// suite is a real API server for the tests that run the whole agent.
var suite = &testenv.Suite{Root: true}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, suite)) }
