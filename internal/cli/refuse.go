package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pelguard/pelguard/event"
)

// synopses maps each FlagSet NewFlagSet made to its synopsis, for the short
// usage a parse error prints. A FlagSet lives as long as its command.
var synopses sync.Map // *flag.FlagSet → string

// jsonStderr is stderr of a command asked for JSON logs: Fail writes its
// error there as a JSON log line. Program.Main wraps it.
type jsonStderr struct{ io.Writer }

// wantsJSON reports whether args (else LOG_FORMAT) ask for JSON logs, as
// the command's own --log-format will once parsed: the last value wins.
func wantsJSON(args []string) bool {
	format := Env("LOG_FORMAT", "")
	for i, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "log-format" {
			continue
		}
		switch {
		case hasValue:
			format = value
		case i+1 < len(args):
			format = args[i+1]
		}
	}
	return format == "json"
}

// libraryPrefixes start the errors of the libraries behind each binary
// ("consumer: --workers 0 …"): Fail names the program already.
var libraryPrefixes = []string{"consumer: ", "reaper: ", "audit: ", "auditor: ", "console: "}

// trimLibraryPrefix drops a library's own prefix from the start of msg, so
// an error reads "pelguard-consumer: --workers …", not "…: consumer: …".
func trimLibraryPrefix(msg string) string {
	for again := true; again; {
		again = false
		for _, p := range libraryPrefixes {
			if strings.HasPrefix(msg, p) {
				msg, again = msg[len(p):], true
			}
		}
	}
	return msg
}

// given reports whether flag name was set on the command line.
func given(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// nonEmpty are the string flags whose empty value the libraries would take
// as their default (or that are nonsense empty): an empty --namespace is
// the default namespace, which changes every idempotency key a team chose.
// Flags whose empty value is documented ("empty: off", "empty: all") are
// not here.
var nonEmpty = []string{"namespace", "group", "stream", "db-schema", "charge-description", "redis-url", "database-url",
	"log-format", "log-level", "stripe-mode", "stripe-account", "listen", "legacy-pattern", "description"}

// positive are the numeric and duration flags whose 0 the libraries take as
// their default: `--workers 0` would run 8 workers without a word. Flags
// whose 0 is documented as "off", "never", "none" or "all"
// (--follow-up-every, --decline-retries, --consumer-idle, --settle-delay,
// --db-max-conns, --wait-for-deps, --stripe-retries, --stripe-rate, replay's
// --limit, --cents …) are not here.
var positive = []string{"count", "block", "workers", "lease", "safe-key-window", "max-amount-cents",
	"dead-letter-alert-interval", "stripe-timeout", "shutdown-timeout", "tolerance",
	"min-idle", "interval", "page-size", "page-workers", "max-deliveries",
	"parallel", "overlap", "initial-lookback", "stuck-after", "stuck-processing-after",
	"max-refunds", "max-cents", "max-refunds-24h", "max-cents-24h", "max-refund-cents", "limit"}

// envTag is the environment variable a flag's usage names: "… [PELGUARD_NAMESPACE]".
var envTag = regexp.MustCompile(`\[([A-Z][A-Z0-9_]+)[],]`)

// meaningful holds, per FlagSet, the flags Refuse leaves alone there.
var meaningful sync.Map // *flag.FlagSet → []string

// ZeroMeans tells Parse that on fs an empty or 0 value of the flags named
// means something (documented in their usage): the auditor's optional
// --redis-url, replay's --limit 0 "all".
func ZeroMeans(fs *flag.FlagSet, names ...string) {
	if m, ok := meaningful.Load(fs); ok {
		names = append(slices.Clone(m.([]string)), names...)
	}
	meaningful.Store(fs, names)
}

// Refuse stops a command whose flags or environment say nothing sensible,
// before anything is built: an empty value or a 0 that would silently mean
// the default (the tables above), an environment variable set but empty
// for such a flag, and an environment value the flag cannot parse (which
// Env* would otherwise drop for the default). except names the flags of fs
// whose empty or 0 value means something there, besides those ZeroMeans
// named. Parse calls it for every command.
func Refuse(fs *flag.FlagSet, except ...string) error {
	if m, ok := meaningful.Load(fs); ok {
		except = append(except, m.([]string)...)
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || slices.Contains(except, f.Name) {
			return
		}
		err = refuseFlag(fs, f)
	})
	return err
}

func refuseFlag(fs *flag.FlagSet, f *flag.Flag) error {
	mustFill := slices.Contains(nonEmpty, f.Name)
	if m := envTag.FindStringSubmatch(f.Usage); m != nil && !given(fs, f.Name) {
		if v, ok := os.LookupEnv(m[1]); ok {
			v = strings.TrimSpace(v)
			if v == "" && mustFill {
				return Usagef("%s is set but empty: give it a value, or unset it for the default (--%s %s)", m[1], f.Name, emptyDefault(f))
			}
			if err := checkEnvValue(f, v); err != nil {
				return Usagef("%s=%q: %v (it sets --%s)", m[1], v, err, f.Name)
			}
		}
	}
	if mustFill && (given(fs, f.Name) || f.DefValue != "") && strings.TrimSpace(f.Value.String()) == "" {
		return Usagef("--%s is empty: give a value, or leave the flag out for the default (%s)", f.Name, emptyDefault(f))
	}
	if slices.Contains(positive, f.Name) && !isPositive(f.Value) {
		return Usagef("--%s %s: want more than 0 (leave the flag out for the default, %s)", f.Name, f.Value, f.DefValue)
	}
	return nil
}

// checkEnvValue parses v as f's type would, without changing f.
func checkEnvValue(f *flag.Flag, v string) error {
	if v == "" {
		return nil
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return nil // strings, lists: any text parses
	}
	var err error
	switch g.Get().(type) {
	case int:
		_, err = strconv.Atoi(v)
	case int64:
		_, err = strconv.ParseInt(v, 10, 64)
	case float64:
		_, err = strconv.ParseFloat(v, 64)
	case bool:
		_, err = strconv.ParseBool(v)
	case time.Duration:
		_, err = time.ParseDuration(v)
	}
	if err != nil {
		return fmt.Errorf("want a %s", Placeholder(f))
	}
	return nil
}

func isPositive(v flag.Value) bool {
	g, ok := v.(flag.Getter)
	if !ok {
		return true
	}
	switch n := g.Get().(type) {
	case int:
		return n > 0
	case int64:
		return n > 0
	case float64:
		return n > 0
	case time.Duration:
		return n > 0
	}
	return true
}

func emptyDefault(f *flag.Flag) string {
	if _, secret := f.Value.(*secretValue); secret {
		return "from the environment"
	}
	if f.Name == "stream" {
		return "billing-stream"
	}
	if f.DefValue == "" {
		return "none"
	}
	return printableDefault(f)
}

// Period refuses a --period value that is not a billing period in a form
// events accept: the same check as the consumer's, so `cap set --period
// 2026-13` fails as an event for 2026-13 would. An empty value is for the
// caller to allow or refuse.
func Period(flagName, value string) error {
	if value == "" {
		return nil
	}
	if err := event.ValidPeriod(value); err != nil {
		return Usagef("--%s: %v", flagName, err)
	}
	return nil
}

// MonthPeriod is Period for the commands that read a period as a calendar
// month (`auditor run --period`, `import --period`): another valid form is
// refused with what to give instead.
func MonthPeriod(flagName, value, instead string) error {
	if err := Period(flagName, value); err != nil || value == "" {
		return err
	}
	if _, err := time.Parse("2006-01", value); err != nil {
		return Usagef("--%s %s: this command takes a month (YYYY-MM); %s", flagName, value, instead)
	}
	return nil
}
