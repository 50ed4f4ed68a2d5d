package pg

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every statement of pelguard's names its schema: a table of pelguard's
// written without {schema}. in any non-test Go file would resolve through
// search_path, possibly to the team's own billing_records.
func TestEveryStatementNamesTheSchema(t *testing.T) {
	t.Parallel()
	unqualified := regexp.MustCompile(`(?i)\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+(billing_records|spend_caps|audit_runs|audit_findings|import_runs|imported_periods|external_leases|refund_ledger|webhook_events|audit_stage|audit_pending|console_actions|ledger_witness|ledger_fence|ledger_rollbacks|meter_events|meter_inflight|console_sessions|console_login_attempts|console_keys|pelguard_schema_migrations)\b`)
	root := filepath.Join("..", "..")
	var checked int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "teamsys", "testdata": // teamsys writes the team's own table, as the team does
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			if m := unqualified.FindString(line); m != "" {
				t.Errorf("%s:%d: %q names a pelguard table without %s.", path, i+1, m, SchemaToken)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d Go files checked: the walk missed the repository", checked)
	}
}

func TestSearchPath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		params map[string]string
		want   string
		ok     bool
	}{
		{map[string]string{}, "", false},
		{map[string]string{"search_path": "public"}, "public", true},
		{map[string]string{"search_path": ` "pelguard" `}, "pelguard", true},
		{map[string]string{"options": "-csearch_path=billing"}, "billing", true},
		{map[string]string{"options": "-c search_path=a,b"}, "a,b", true},
	} {
		got, ok := SearchPath(c.params)
		if got != c.want || ok != c.ok {
			t.Errorf("SearchPath(%v) = %q %v, want %q %v", c.params, got, ok, c.want, c.ok)
		}
	}
	if ValidSchema("pelguard") != nil || ValidSchema("Bad-Name") == nil || ValidSchema("pg_catalog") == nil {
		t.Error("ValidSchema accepts or refuses the wrong names")
	}
}
