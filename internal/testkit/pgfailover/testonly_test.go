package pgfailover_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The kit kills servers and trusts every loopback connection: it must
// never ship. No package of the module may import it outside _test.go
// files (go list's Imports excludes test imports).
func TestOnlyImportedByTests(t *testing.T) {
	t.Parallel()
	const kit = "github.com/pelguard/pelguard/internal/testkit/pgfailover"
	out, err := exec.Command("go", "list", "-e", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "github.com/pelguard/pelguard/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		for _, imp := range strings.Fields(imports) {
			if imp == kit {
				t.Errorf("%s imports the test kit %s outside its tests", pkg, kit)
			}
		}
	}
	if !strings.Contains(string(out), kit) {
		t.Fatalf("go list did not list %s itself; the check saw the wrong module:\n%s", kit, out)
	}
}
