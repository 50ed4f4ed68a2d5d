package refdocs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// constant is a constant declared in a package's source.
type constant struct {
	Name, Value, Doc string
}

// constants parses the non-test Go files of dir and returns the constants
// keep selects, with their doc comments (the comment above the constant,
// else its group's, else its line comment).
func constants(dir string, keep func(spec *ast.ValueSpec, i int) bool) ([]constant, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var out []constant
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", filepath.Base(name), err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !id.IsExported() || !keep(vs, i) || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						continue
					}
					v := lit.Value
					if u, err := strconv.Unquote(v); err == nil {
						v = u
					}
					doc := vs.Doc.Text()
					if doc == "" && len(gd.Specs) == 1 {
						doc = gd.Doc.Text()
					}
					if doc == "" {
						doc = vs.Comment.Text()
					}
					out = append(out, constant{Name: id.Name, Value: v, Doc: trimName(id.Name, doc)})
				}
			}
		}
	}
	return out, nil
}

// ExitCodes renders exit-codes.md from internal/cli's Exit* constants.
func ExitCodes(root string) (string, error) {
	cs, err := constants(filepath.Join(root, "internal", "cli"), func(vs *ast.ValueSpec, i int) bool {
		return strings.HasPrefix(vs.Names[i].Name, "Exit")
	})
	if err != nil {
		return "", err
	}
	if len(cs) == 0 {
		return "", fmt.Errorf("no Exit* constants in internal/cli")
	}
	slices.SortFunc(cs, func(a, b constant) int {
		x, _ := strconv.Atoi(a.Value)
		y, _ := strconv.Atoi(b.Value)
		return x - y
	})
	var b strings.Builder
	b.WriteString(header("Exit codes", "internal/cli's Exit* constants and their comments"))
	b.WriteString("Every pelguard binary exits with one of these. A supervisor (systemd, Kubernetes) can tell\n" +
		"them apart: 2 fails again until the configuration changes, 3 may pass on a later start.\n\n")
	b.WriteString("| Code | Constant | Meaning |\n|---|---|---|\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s | `cli.%s` | %s |\n", c.Value, c.Name, cell(c.Doc))
	}
	return b.String(), nil
}

// Alerts renders alerts.md from the alerts package's Kind constants.
func Alerts(root string) (string, error) {
	cs, err := constants(filepath.Join(root, "alerts"), func(vs *ast.ValueSpec, _ int) bool {
		id, ok := vs.Type.(*ast.Ident)
		return ok && id.Name == "Kind"
	})
	if err != nil {
		return "", err
	}
	if len(cs) == 0 {
		return "", fmt.Errorf("no Kind constants in alerts")
	}
	slices.SortFunc(cs, func(a, b constant) int { return strings.Compare(a.Value, b.Value) })
	var b strings.Builder
	b.WriteString(header("Alerts", "the alerts package's Kind constants and their comments"))
	b.WriteString("Every alert has a kind: the `kind` label of `pelguard_alerts_sent_total` and\n" +
		"`pelguard_alerts_failed_total` (see [metrics](metrics.md)). Sorted by kind.\n\n")
	b.WriteString("| Kind | Constant | About |\n|---|---|---|\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| `%s` | `alerts.%s` | %s |\n", c.Value, c.Name, cell(c.Doc))
	}
	return b.String(), nil
}

// trimName joins doc's lines and drops the constant's own name where the
// comment starts with it ("ExitError: bad flags…", "KindX is a …"): the
// table names the constant beside it.
func trimName(name, doc string) string {
	doc = strings.Join(strings.Fields(doc), " ")
	for _, p := range []string{name + ": ", name + " is ", name + " "} {
		if rest, ok := strings.CutPrefix(doc, p); ok {
			return rest
		}
	}
	return doc
}
