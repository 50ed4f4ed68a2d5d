package apicheck

import (
	"go/types"
	"slices"
	"strings"
	"testing"
)

// The packages issue 14 makes public. Every other package of the module
// outside internal/ that is not a command is checked too; these must be among them, so a
// loader that silently found nothing fails.
var wantPublic = []string{"consumer", "reaper", "audit", "alerts", "event", "clock", "stripeapi", "migrations", "redisurl"}

const module = "github.com/pelguard/pelguard"

// buildFlags are the test binary's own (race_test.go adds -race), so
// LoadPublic reads the export data its build already cached.
var buildFlags []string

// TestPublicAPIHasNoInternalTypes is the boundary check: a public package
// whose exported identifiers mention an internal/ type cannot be used from
// another module (examples/embed is the module that proves it can).
func TestPublicAPIHasNoInternalTypes(t *testing.T) {
	t.Parallel()
	public, fset, err := LoadPublic("../../..", buildFlags, "./...")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range wantPublic {
		if !slices.ContainsFunc(public, func(p *types.Package) bool { return p.Path() == module+"/"+name }) {
			t.Errorf("public package %s was not loaded", name)
		}
	}
	for _, l := range Check(fset, public) {
		t.Errorf("%s (public API must not expose internal/ types: export a type of the public package instead)", l)
	}
}

// TestCheckFindsLeaks runs the check over testdata/leak, a module whose
// public package pub leaks its internal package's types in every way the
// check looks for, and uses them in ways that are not leaks.
func TestCheckFindsLeaks(t *testing.T) {
	t.Parallel()
	public, fset, err := LoadPublic("testdata/leak", buildFlags, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(public) != 1 || public[0].Path() != "example.com/leak/pub" {
		t.Fatalf("public packages = %v, want only example.com/leak/pub", public)
	}
	leaks := Check(fset, public)

	want := []string{
		"pub.Alias: secret.Token",
		"pub.Boxed type argument: secret.Token",
		"pub.Client.Store result 0: secret.Store",
		"pub.Config.Anon.T: secret.Token",
		"pub.Config.ByName: secret.Token",
		"pub.Config.Embedded: secret.Embedded",
		"pub.Config.Keyed key: secret.Token",
		"pub.Config.Nested.Deep: secret.Token",
		"pub.Config.OnDone param 0: secret.Token",
		"pub.Config.Store: secret.Store",
		"pub.Default: secret.Store",
		"pub.Hooks.After: secret.Token",
		"pub.Limit: secret.Count",
		"pub.Make result 0: secret.Token",
		"pub.Open param s: secret.Store",
		"pub.Service embeds: secret.Runner",
		"pub.Service.Do param t: secret.Token",
		"pub.Sum type parameter T: secret.Number",
		"pub.Wrapper.Get result 0: secret.Token",
		"pub.Wrapper.Inner: secret.Inner",
	}
	var got []string
	for _, l := range leaks {
		got = append(got, l.Ident+": "+l.Type)
		if l.Package != "example.com/leak/internal/secret" {
			t.Errorf("%s: package %q, want example.com/leak/internal/secret", l.Ident, l.Package)
		}
		if !strings.Contains(l.Pos.Filename, "pub.go") || l.Pos.Line == 0 {
			t.Errorf("%s: position %v, want a line of pub.go", l.Ident, l.Pos)
		}
		if s := l.String(); !strings.Contains(s, l.Ident) || !strings.Contains(s, "secret.") {
			t.Errorf("Leak.String() = %q: names neither the identifier nor the type", s)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("leaks:\n got %q\nwant %q", got, want)
	}
}

func TestIsInternal(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]bool{
		"github.com/pelguard/pelguard/internal/ledger": true,
		"github.com/pelguard/pelguard/internal":        true,
		"internal/poll":                                true,
		"github.com/pelguard/pelguard/consumer":        false,
		"example.com/internals/x":                      false,
	} {
		if got := IsInternal(path); got != want {
			t.Errorf("IsInternal(%q) = %v, want %v", path, got, want)
		}
	}
}
