// Package apicheck enforces pelguard's public API boundary (issue 14): no
// exported identifier of a public package may have a type that comes from an
// internal/ package, because another module can neither name nor build such
// a value, so a Config with such a field cannot be filled in from outside.
//
// Packages are loaded from the export data the go command writes into its
// build cache (`go list -export -deps`), read with go/importer's "gc"
// importer through a lookup over go list's Export paths. That is the data
// the compiler reads when another module imports pelguard; it needs no
// dependency beyond the standard library (golang.org/x/tools/go/packages
// would make the same go list call), and it does not type-check the
// dependencies' source as the "source" importer would (stripe-go alone is
// large).
package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Leak is one exported identifier whose type reaches an internal/ package.
type Leak struct {
	// Ident names the identifier from the package's name down to the part
	// that leaks: "consumer.Config.Ledger", "consumer.New param cfg",
	// "consumer.Consumer.Ledger result 0".
	Ident string
	// Type is the internal named type, qualified by its package's name:
	// "ledger.Ledger" (for a field of type *ledger.Ledger or []ledger.Ledger).
	Type string
	// Package is the import path of the internal package the type comes from.
	Package string
	// Pos is where Ident is declared.
	Pos token.Position
}

func (l Leak) String() string {
	return fmt.Sprintf("%s: %s uses %s from %s", l.Pos, l.Ident, l.Type, l.Package)
}

// LoadPublic returns the type information of the public packages among
// those patterns match in dir: every one that is neither internal (see
// IsInternal) nor a command (nothing imports a main package). It runs `go
// list` once to find them and once more with -export -deps over them alone,
// so only their dependencies are compiled. buildFlags go to the second run:
// a test built with -race passes -race, so the export data is the one its
// own build already put in the cache rather than a second compile of every
// dependency.
func LoadPublic(dir string, buildFlags []string, patterns ...string) ([]*types.Package, *token.FileSet, error) {
	type listed struct {
		ImportPath string
		Name       string
		Export     string
		DepOnly    bool
		ImportMap  map[string]string
		Error      *struct{ Err string }
	}
	goList := func(args ...string) ([]listed, error) {
		cmd := exec.Command("go", append([]string{"list", "-e"}, args...)...)
		cmd.Dir = dir
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go list in %s: %w: %s", dir, err, stderr.Bytes())
		}
		var out []listed
		var errs []error
		for dec := json.NewDecoder(&stdout); ; {
			var p listed
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				return nil, fmt.Errorf("decoding go list output: %w", err)
			}
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err))
			}
			out = append(out, p)
		}
		return out, errors.Join(errs...)
	}

	matched, err := goList(append([]string{"-json=ImportPath,Name,Error"}, patterns...)...)
	if err != nil {
		return nil, nil, err
	}
	var roots []string
	for _, p := range matched {
		if p.Name != "main" && !IsInternal(p.ImportPath) {
			roots = append(roots, p.ImportPath)
		}
	}
	if len(roots) == 0 {
		return nil, nil, fmt.Errorf("no public package matches %q in %s", patterns, dir)
	}

	args := append([]string{"-export", "-deps", "-json=ImportPath,Export,ImportMap,Error"}, buildFlags...)
	deps, err := goList(append(args, roots...)...)
	if err != nil {
		return nil, nil, err
	}
	exports := map[string]string{}
	for _, p := range deps {
		exports[p.ImportPath] = p.Export
	}
	for _, p := range deps {
		for from, to := range p.ImportMap {
			if _, ok := exports[from]; !ok {
				exports[from] = exports[to]
			}
		}
	}

	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(file)
	})
	pkgs := make([]*types.Package, 0, len(roots))
	for _, path := range roots {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, nil, fmt.Errorf("importing %s: %w", path, err)
		}
		pkgs = append(pkgs, pkg)
	}
	return pkgs, fset, nil
}

// IsInternal reports whether an import path has an "internal" element, the
// go command's rule for who may import it.
func IsInternal(path string) bool {
	return slices.Contains(strings.Split(path, "/"), "internal")
}

// Check returns every leak in pkgs, which are taken to be the public
// packages: exported constants, variables, functions and types; exported
// fields (embedded ones too) and methods (promoted ones too) of exported
// types; interface methods; parameters and results of every signature met.
// Named types of pkgs that are not exported are followed too, since their
// exported fields and methods are reachable through an exported one;
// exported ones are checked once, at their own declaration.
func Check(fset *token.FileSet, pkgs []*types.Package) []Leak {
	c := &checker{fset: fset, public: map[*types.Package]bool{}, seen: map[*types.Named]bool{}}
	for _, p := range pkgs {
		c.public[p] = true
	}
	for _, p := range pkgs {
		scope := p.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			c.pos = obj.Pos()
			ident := p.Name() + "." + name
			switch obj := obj.(type) {
			case *types.TypeName:
				if obj.IsAlias() {
					c.typ(ident, obj.Type())
					continue
				}
				if named, ok := obj.Type().(*types.Named); ok {
					c.named(ident, named)
				}
			default: // *types.Const, *types.Var, *types.Func
				c.typ(ident, obj.Type())
			}
		}
	}
	return c.leaks
}

type checker struct {
	fset   *token.FileSet
	public map[*types.Package]bool
	seen   map[*types.Named]bool
	pos    token.Pos // of the declaration being walked, for Leak.Pos
	leaks  []Leak
}

// named checks a named type of a public package: its type parameters'
// constraints, its underlying type and its method set.
func (c *checker) named(ident string, t *types.Named) {
	if c.seen[t.Origin()] {
		return
	}
	c.seen[t.Origin()] = true
	for tp := range t.TypeParams().TypeParams() {
		c.typ(ident+" type parameter "+tp.Obj().Name(), tp.Constraint())
	}
	c.underlying(ident, t.Underlying())
	if types.IsInterface(t) {
		return // the underlying walk covered the methods
	}
	ms := types.NewMethodSet(types.NewPointer(t))
	for sel := range ms.Methods() {
		m := sel.Obj()
		if !m.Exported() {
			continue
		}
		pos := m.Pos()
		if len(sel.Index()) > 1 {
			pos = token.NoPos // promoted: report it at the type, not in the embedded one's package
		}
		c.at(pos, func() { c.signature(ident+"."+m.Name(), sel.Type().(*types.Signature)) })
	}
}

// underlying walks a type literal: the fields of a struct, the methods and
// embedded types of an interface, the elements of anything else.
func (c *checker) underlying(ident string, t types.Type) {
	switch t := t.(type) {
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				c.at(f.Pos(), func() { c.typ(ident+"."+f.Name(), f.Type()) })
			}
		}
	case *types.Interface:
		for e := range t.EmbeddedTypes() {
			c.typ(ident+" embeds", e)
		}
		for m := range t.Methods() {
			if m.Exported() {
				c.at(m.Pos(), func() { c.signature(ident+"."+m.Name(), m.Type().(*types.Signature)) })
			}
		}
	default:
		c.typ(ident, t)
	}
}

// at runs walk with leaks reported at pos, or where the enclosing
// declaration is when pos is NoPos.
func (c *checker) at(pos token.Pos, walk func()) {
	outer := c.pos
	if pos.IsValid() {
		c.pos = pos
	}
	walk()
	c.pos = outer
}

func (c *checker) signature(ident string, sig *types.Signature) {
	for tp := range sig.TypeParams().TypeParams() {
		c.typ(ident+" type parameter "+tp.Obj().Name(), tp.Constraint())
	}
	for i := range sig.Params().Len() {
		v := sig.Params().At(i)
		c.typ(ident+" param "+varName(v, i), v.Type())
	}
	for i := range sig.Results().Len() {
		v := sig.Results().At(i)
		c.typ(ident+" result "+varName(v, i), v.Type())
	}
}

func varName(v *types.Var, i int) string {
	if v.Name() != "" && v.Name() != "_" {
		return v.Name()
	}
	return fmt.Sprint(i)
}

// typ walks a type met at ident, reporting internal named types.
func (c *checker) typ(ident string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		// An alias declared in an internal package for a type a caller can
		// name is not a leak; an alias of an internal type is, and
		// Unalias finds it.
		c.typ(ident, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && IsInternal(obj.Pkg().Path()) {
			c.leaks = append(c.leaks, Leak{
				Ident:   ident,
				Type:    types.TypeString(t, func(p *types.Package) string { return p.Name() }),
				Package: obj.Pkg().Path(),
				Pos:     c.fset.Position(c.pos),
			})
			return
		}
		for a := range t.TypeArgs().Types() {
			c.typ(ident+" type argument", a)
		}
		if c.public[obj.Pkg()] && !obj.Exported() {
			c.named(ident, t)
		}
	case *types.Pointer:
		c.typ(ident, t.Elem())
	case *types.Slice:
		c.typ(ident, t.Elem())
	case *types.Array:
		c.typ(ident, t.Elem())
	case *types.Chan:
		c.typ(ident, t.Elem())
	case *types.Map:
		c.typ(ident+" key", t.Key())
		c.typ(ident, t.Elem())
	case *types.Signature:
		c.signature(ident, t)
	case *types.Struct, *types.Interface:
		c.underlying(ident, t)
	case *types.Union:
		for term := range t.Terms() {
			c.typ(ident, term.Type())
		}
	case *types.TypeParam:
		// Its constraint is checked where the parameter is declared.
	case *types.Basic, *types.Tuple, nil:
	}
}
