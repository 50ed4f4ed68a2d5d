package cli

import (
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// The flag package's parse errors, as it words them (Go 1.26,
// flag.FlagSet.parseOne). They name the flag with one dash and say
// "parse error" without saying what to give instead.
var (
	flagBadValue = regexp.MustCompile(`^invalid value "((?:[^"\\]|\\.)*)" for flag -([^:]+): (.*)$`)
	flagBadBool  = regexp.MustCompile(`^invalid boolean (?:value "((?:[^"\\]|\\.)*)" for -|flag )([^:]+): `)
	flagNoValue  = regexp.MustCompile(`^flag needs an argument: -(.+)$`)
	flagSyntax   = regexp.MustCompile(`^bad flag syntax: (.*)$`)
)

// flagErrorMessage rewords a parse error of fs in the words the rest of
// the commands use: the flag as typed (--name), the value, and what to
// give instead. An error it does not know is returned as is.
func flagErrorMessage(fs *flag.FlagSet, msg string) string {
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + strings.TrimPrefix(name, "-")
	}
	if m := flagBadValue.FindStringSubmatch(msg); m != nil {
		value, name, why := m[1], m[2], m[3]
		f := fs.Lookup(name)
		if f == nil || (why != "parse error" && why != "value out of range") {
			// A value of pelguard's own (a list, a secret) says why itself.
			return fmt.Sprintf("--%s %q: %s", name, value, why)
		}
		return fmt.Sprintf("--%s %q: %s", name, value, want(f, why == "value out of range"))
	}
	if m := flagBadBool.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("--%s=%q: want true or false (--%s alone means true)", m[2], m[1], m[2])
	}
	if m := flagNoValue.FindStringSubmatch(msg); m != nil {
		name := m[1]
		if f := fs.Lookup(name); f != nil {
			return fmt.Sprintf("--%s needs a value: %s", name, strings.TrimPrefix(want(f, false), "want "))
		}
		return fmt.Sprintf("--%s needs a value", name)
	}
	if m := flagSyntax.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("bad flag syntax %q: write --name value or --name=value", m[1])
	}
	return msg
}

// want says what f takes, with its default as the example.
func want(f *flag.Flag, outOfRange bool) string {
	example := ""
	// A negative default is a marker ("not given"), no example to copy.
	if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && !strings.HasPrefix(f.DefValue, "-") {
		example = ", such as the default " + printableDefault(f)
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "want a " + Placeholder(f) + example
	}
	switch g.Get().(type) {
	case int, int64:
		if outOfRange {
			return "too large: want a whole number" + example
		}
		return "want a whole number" + example
	case uint, uint64:
		if outOfRange {
			return "too large: want a whole number of 0 or more" + example
		}
		return "want a whole number of 0 or more" + example
	case float64:
		if outOfRange {
			return "out of range: want a number" + example
		}
		return "want a number" + example
	case time.Duration:
		if example == "" {
			example = ", such as 30s"
		}
		return "want a duration with its unit (ms, s, m, h: 500ms, 30s, 5m, 1h30m)" + example
	case bool:
		return "want true or false"
	}
	return "want a " + Placeholder(f) + example
}
