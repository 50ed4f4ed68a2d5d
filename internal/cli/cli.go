// Package cli is the plumbing every pelguard binary shares: flags with
// environment fallbacks, logging, opening Redis/Postgres/Stripe/Slack, the
// `migrate` subcommand, the ops HTTP server and signal handling. It keeps the
// mains thin and their behaviour the same.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pelguard/pelguard/internal/redact"
)

// Exit codes shared by every binary.
const (
	ExitOK       = 0
	ExitFindings = 1 // the auditor: findings exist
	ExitError    = 2 // bad flags, bad config, unreachable dependency, failure
)

// UsageError is a configuration mistake the user must fix; mains print it
// and exit 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef builds a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Env returns the environment variable or def.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}

// EnvDuration returns the environment variable parsed as a duration, or def
// when unset. A bad value is reported at flag validation through def's flag.
func EnvDuration(name string, def time.Duration) time.Duration {
	if v := Env(name, ""); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// EnvInt returns the environment variable parsed as an int, or def.
func EnvInt(name string, def int) int {
	if v := Env(name, ""); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// EnvBool returns the environment variable parsed as a bool, or def.
func EnvBool(name string, def bool) bool {
	if v := Env(name, ""); v != "" {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return def
}

// NewFlagSet returns a FlagSet that reports errors instead of exiting and
// prints usage with a description paragraph and redacted defaults (a default
// taken from the environment may hold a secret).
func NewFlagSet(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n", synopsis, strings.TrimSpace(description))
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			line := "  --" + f.Name
			if name != "" {
				line += " " + name
			}
			fmt.Fprintf(stderr, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
				fmt.Fprintf(stderr, " (default %s)", redact.String(redactValue(f.Name, f.DefValue)))
			}
			fmt.Fprintln(stderr)
		})
	}
	return fs
}

// redactValue hides flag defaults that are secrets whatever they look like.
func redactValue(name, v string) string {
	n := strings.ToLower(name)
	if strings.Contains(n, "key") || strings.Contains(n, "token") || strings.Contains(n, "webhook") {
		if v != "" {
			return redact.Mask
		}
	}
	if strings.Contains(n, "url") {
		return redact.URL(v)
	}
	return v
}

// Parse parses args. -h/--help prints usage and returns flag.ErrHelp.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Msg: err.Error()}
	}
	return nil
}

// Logging flags.
type Logging struct {
	Format string
	Level  string
}

// Register adds --log-format and --log-level.
func (l *Logging) Register(fs *flag.FlagSet) {
	fs.StringVar(&l.Format, "log-format", Env("LOG_FORMAT", "text"), "log format: text (for humans) or json (for production) [LOG_FORMAT]")
	fs.StringVar(&l.Level, "log-level", Env("LOG_LEVEL", "info"), "log level: debug, info, warn, error [LOG_LEVEL]")
}

// Logger builds the logger. Every record passes through redaction, so a
// secret inside a library's error never reaches the log.
func (l *Logging) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, Usagef("--log-level %q: want debug, info, warn or error", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: redactAttr}
	switch l.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, Usagef("--log-format %q: want text or json", l.Format)
}

func redactAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); s != "" {
			if r := redact.String(s); r != s {
				return slog.String(a.Key, r)
			}
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok && err != nil {
			return slog.String(a.Key, redact.String(err.Error()))
		}
	}
	return a
}

// SignalContext is cancelled on SIGINT or SIGTERM.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// Fail prints err for a human and returns the exit code.
func Fail(stderr io.Writer, prog string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	fmt.Fprintf(stderr, "%s: %s\n", prog, redact.String(err.Error()))
	var ue *UsageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", prog)
	}
	return ExitError
}
