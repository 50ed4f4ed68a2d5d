package apicheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDocSnippetsAreCompiled keeps the library snippets of the READMEs true:
// every Go block of the section must appear, line for line (indentation
// aside), in a file the Go toolchain compiles, so an API change that breaks
// the snippet breaks that file's build first.
func TestDocSnippetsAreCompiled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, heading, src string }{
		{"docs/library.md", "# Using pelguard as a library", "examples/embed/billing.go"},
		{"reaper/README.md", "## Library", "reaper/example_test.go"},
	} {
		// A newline first, so a page's own title is found like a section.
		doc := "\n" + read(t, tc.doc)
		i := strings.Index(doc, "\n"+tc.heading+"\n")
		if i < 0 {
			t.Errorf("%s: no section %q", tc.doc, tc.heading)
			continue
		}
		section := doc[i+len(tc.heading)+2:]
		if j := strings.Index(section, "\n## "); j >= 0 {
			section = section[:j]
		}
		blocks := goBlocks(section)
		if len(blocks) == 0 {
			t.Errorf("%s %q: no Go code block", tc.doc, tc.heading)
		}
		src := codeLines(read(t, tc.src))
		for _, b := range blocks {
			if !containsRun(src, codeLines(b)) {
				t.Errorf("%s %q: this block is not in %s (copy it from there):\n%s", tc.doc, tc.heading, tc.src, b)
			}
		}
	}
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goBlocks returns the bodies of the ```go fences in md.
func goBlocks(md string) []string {
	var out []string
	for {
		i := strings.Index(md, "```go\n")
		if i < 0 {
			return out
		}
		md = md[i+len("```go\n"):]
		j := strings.Index(md, "```")
		if j < 0 {
			return out
		}
		out = append(out, md[:j])
		md = md[j+3:]
	}
}

// codeLines is s's non-blank lines without their indentation.
func codeLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// containsRun reports whether run occurs in lines as consecutive lines.
func containsRun(lines, run []string) bool {
	for i := 0; i+len(run) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
