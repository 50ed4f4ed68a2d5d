package refdocs

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

var update = flag.Bool("update", false, "rewrite docs/reference/ from the code")

const root = "../../.."

// TestReferenceUpToDate regenerates docs/reference/ and fails on any
// difference with the committed pages: a flag, exit code, series, alert
// kind or column changed without `make docs`. With -update it writes them.
func TestReferenceUpToDate(t *testing.T) {
	pool := testenv.DB(t) // before the environment is emptied: it reads DATABASE_URL
	schema := testenv.SchemaOf(pool)
	// Flags take their defaults from the environment when it sets them
	// (DATABASE_URL, PELGUARD_*, LOG_*...): the reference shows the built-in
	// ones, whatever the machine that generates it has set.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "" && !keepEnv[k] {
			t.Setenv(k, "")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pages, err := Generate(ctx, root, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, Dir)
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, text := range pages {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	committed, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range committed {
		if _, ok := pages[filepath.Base(path)]; !ok {
			t.Errorf("%s is not generated any more: delete it (git rm), or run `make docs`", filepath.Join(Dir, filepath.Base(path)))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(pages)) {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v: run `make docs` (go test ./internal/refdocs -update)", filepath.Join(Dir, name), err)
			continue
		}
		if string(got) != pages[name] {
			t.Errorf("%s is out of date: run `make docs` (go test ./internal/refdocs -update) and commit it; first difference:\n%s",
				filepath.Join(Dir, name), firstDiff(string(got), pages[name]))
		}
	}
}

// keepEnv are the variables the generator itself needs; no flag reads them.
var keepEnv = map[string]bool{"PATH": true, "HOME": true, "TMPDIR": true, "GOCOVERDIR": true}

// firstDiff shows the first line where the committed page and the
// generated one differ.
func firstDiff(committed, generated string) string {
	a, b := strings.Split(committed, "\n"), strings.Split(generated, "\n")
	for i := 0; i < max(len(a), len(b)); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  committed: %s\n  generated: %s", i+1, x, y)
		}
	}
	return "(none)"
}
