package refdocs

import (
	"slices"
	"testing"
)

// TestParseUsage pins the parts of cli.NewFlagSet's usage text the
// reference reads: a multi-line usage, a default, both forms of the
// environment suffix, a flag with neither.
func TestParseUsage(t *testing.T) {
	t.Parallel()
	u, err := ParseUsage("Usage: x run [flags]\n\nDoes x.\n\nCommands:\n  run  it\n\nFlags:\n" +
		"  --a string\n    \tfirst line\n    \tsecond line [X_A] (default def)\n" +
		"  --b value\n    \trepeatable [X_B, comma-separated]\n" +
		"  --c\n    \ta switch\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []Flag{
		{Name: "a", Placeholder: "string", Default: "def", Env: "X_A", Usage: "first line second line"},
		{Name: "b", Placeholder: "value", Env: "X_B (comma-separated)", Usage: "repeatable"},
		{Name: "c", Usage: "a switch"},
	}
	if u.Synopsis != "x run [flags]" || u.Description != "Does x." || !slices.Equal(u.Flags, want) {
		t.Errorf("ParseUsage = %+v, want synopsis %q, description %q, flags %+v", u, "x run [flags]", "Does x.", want)
	}
	if _, err := ParseUsage("Usage: x\n\nno flags paragraph\n"); err == nil {
		t.Error("ParseUsage accepted a text without Flags:")
	}
}
