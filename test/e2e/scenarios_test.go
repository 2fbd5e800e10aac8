//go:build e2e

package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// scenarios is the order the end-to-end scenarios run in, one subtest of
// TestE2E each, named after its function without "test": run one with
// `-run 'TestE2E/NodeLossAndReturn$'`. Scenarios that stop, cut off or
// empty a node, or delete a StorageCluster, come last: they leave the
// cluster changed for what follows. TestScenarioList fails on a scenario
// function missing here or listed twice.
var scenarios = []func(*testing.T){
	testClusterDNS,
	testFlexvolumeRefusedToOtherNamespace,
	testFlexvolumeRefusedReadWriteOncePod,
	testFlexvolumeAgentDown,
	testDeviceHeldOpenBlocksUnstage,
	testPodsReachAPIServer,
	testMultusPublicNetwork,
	testBerthImageRunsItsTools,
	testFlexvolumePod,
	testFlexvolumeReadOnlyPluginFolder,
	testUserspaceSurvivesAgentRestart,
	testPodWritesAndReadsEmptyDir,
	testSnapshotRestore,
	testReadWriteOnceRefusedOnSecondNode,
	testDynamicPVCLifecycle,
	testReadWriteOncePodRefusesSecondPod,
	testBlockModePVC,
	testOnlineExpansion,
	testCephSnapshotCloneExpand,
	testReadWriteManyShare,
	testVMReadWriteManyKernelClient,
	testVMUserspaceNBDHeals,
	testVMUserspaceUblkHeals,
	testVMSanity,
	testVMLocalVolumePowerLoss,
	testVMShareRefusesOtherTenants,
	testVMShareOnWorkloadNode,
	testVMCephKernelMounter,
	testNodeLossAndReturn,
	testLocalVolumeOnLostNode,
	testCephVolumeMovesOffLostNode,
	testCephReadWriteManyShareNodeLost,
	testMultusStorageClusterHolders,
	testMultusMoverAgentRestarts,
	testMultusNetnsAgentRestarts,
	testStorageClusterDeletionCleansNode,
	testTwoStorageClustersOneDeleted,
	testStorageClusterDeletionWithAgentAway,
	testUpgradeAndRollback,
	testHelmInstallAsAUser,
}

// TestE2E runs the scenarios in the order of the list above.
func TestE2E(t *testing.T) {
	for _, s := range scenarios {
		t.Run(strings.TrimPrefix(funcName(s), "test"), s)
	}
}

// funcName is the name a top-level function was declared with.
func funcName(f func(*testing.T)) string {
	full := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
	return full[strings.LastIndex(full, ".")+1:]
}

var scenarioName = regexp.MustCompile(`^test[A-Z]`)

// TestScenarioList needs no cluster: every function of this package shaped
// as a scenario (testXxx(t *testing.T)) is in scenarios, once.
func TestScenarioList(t *testing.T) {
	listed := map[string]int{}
	for _, s := range scenarios {
		listed[funcName(s)]++
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	declared := map[string]bool{}
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && scenarioName.MatchString(fn.Name.Name) && takesOnlyT(fn.Type) {
				declared[fn.Name.Name] = true
				if listed[fn.Name.Name] == 0 {
					t.Errorf("%s (%s): a scenario missing from the list in scenarios_test.go: it would never run",
						fn.Name.Name, fset.Position(fn.Pos()))
				}
			}
		}
	}
	for name, n := range listed {
		if n > 1 {
			t.Errorf("%s is listed %d times in scenarios", name, n)
		}
		if !declared[name] {
			t.Errorf("%s is listed but not declared as testXxx(t *testing.T)", name)
		}
	}
	if len(declared) == 0 {
		t.Error("no scenario functions found: is the test running in test/e2e?")
	}
}

// takesOnlyT tells whether a function type is func(*testing.T).
func takesOnlyT(ft *ast.FuncType) bool {
	if ft.Results != nil && len(ft.Results.List) > 0 || len(ft.Params.List) != 1 || len(ft.Params.List[0].Names) > 1 {
		return false
	}
	star, ok := ft.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "testing" && sel.Sel.Name == "T"
}
