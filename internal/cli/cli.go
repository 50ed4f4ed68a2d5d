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
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pelguard/pelguard/internal/redact"
)

// Exit codes shared by every binary. A supervisor (systemd, Kubernetes)
// can tell them apart: 2 will fail again until someone changes the
// configuration, 3 may pass on a later start.
const (
	ExitOK       = 0
	ExitFindings = 1 // the auditor: findings exist (or duplicates left unrefunded)
	// ExitError: bad flags or configuration (a UsageError, a wrong password,
	// a missing database, pending migrations), or a failure while running.
	ExitError = 2
	// ExitUnavailable: Redis or Postgres did not answer within
	// --wait-for-deps (an UnavailableError). Nothing is wrong with the
	// configuration as far as pelguard can tell; start again later.
	ExitUnavailable = 3
)

// UsageError is a configuration mistake the user must fix; mains print it
// and exit 2.
type UsageError struct {
	Msg string
	// Synopsis, when set, is printed after the error with a pointer to
	// --help: a mistyped flag needs the command's shape, not its manual.
	Synopsis string
}

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
// taken from the environment may hold a secret). A parse error (an unknown
// flag, a bad value) prints nothing itself: Fail prints the error, the
// synopsis and where the flags are, not the whole usage.
func NewFlagSet(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { printUsage(stderr, fs, synopsis, description) }
	synopses.Store(fs, synopsis)
	return fs
}

// printUsage is --help: the synopsis, the description and every flag.
func printUsage(w io.Writer, fs *flag.FlagSet, synopsis, description string) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", synopsis, strings.TrimSpace(description))
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := Placeholder(f), f.Usage
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", printableDefault(f))
		}
		fmt.Fprintln(w)
	})
}

// Placeholder is the word --help shows after a flag: its type. It is taken
// from the flag's Value alone, never from its usage text: flag.UnquoteUsage
// would make the first `backquoted` word of the usage the placeholder
// ("--db-schema migrate up").
func Placeholder(f *flag.Flag) string {
	switch v := f.Value.(type) {
	case *secretValue:
		return "string"
	case interface{ IsBoolFlag() bool }:
		if v.IsBoolFlag() {
			return ""
		}
	}
	// UnquoteUsage names the type from the Value when the usage has no
	// backquotes; give it a copy without them.
	name, _ := flag.UnquoteUsage(&flag.Flag{Name: f.Name, Value: f.Value, Usage: strings.ReplaceAll(f.Usage, "`", "")})
	if name == "value" {
		name = "string" // Streams, lists: repeatable strings
	}
	return name
}

// SecretVar defines a string flag whose value is a secret (a key, a token,
// a URL that is itself a credential). --help prints its default, which
// usually comes from the environment, as [REDACTED], whatever it looks
// like. Every secret-bearing flag is registered this way: the usage printer
// decides by this marker, not by the flag's name.
func SecretVar(fs *flag.FlagSet, p *string, name, value, usage string) {
	*p = value
	fs.Var((*secretValue)(p), name, usage)
}

// secretValue is a string flag marked secret for the usage printer.
type secretValue string

func (s *secretValue) String() string     { return string(*s) }
func (s *secretValue) Set(v string) error { *s = secretValue(v); return nil }

// printableDefault is a flag's default for --help: masked whole for a
// secret flag, its password masked for a URL, and in every case passed
// through redact.String, which catches a secret pasted into any other flag.
func printableDefault(f *flag.Flag) string {
	if _, secret := f.Value.(*secretValue); secret {
		return redact.Mask
	}
	if u, err := url.Parse(f.DefValue); err == nil && u.Scheme != "" && u.Host != "" {
		return redact.URL(f.DefValue)
	}
	return redact.String(f.DefValue)
}

// Parse parses args. -h/--help prints the full usage and returns
// flag.ErrHelp; any other parse error is a UsageError carrying the flag
// set's synopsis, which Fail prints instead of the full usage. Then Refuse
// stops values that would silently mean the default.
func Parse(fs *flag.FlagSet, args []string) error {
	// The flag package prints the error and the whole usage itself on any
	// parse error; silence it and print what the error needs.
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return err
		}
		syn, _ := synopses.Load(fs)
		s, _ := syn.(string)
		return &UsageError{Msg: flagErrorMessage(fs, err.Error()), Synopsis: s}
	}
	return Refuse(fs)
}

// ParseFlags is Parse for a command that takes flags only: a positional
// argument is a usage error naming it.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return Usagef("unexpected argument %q", fs.Arg(0))
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

// Validate checks the flags without building a logger.
func (l *Logging) Validate() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return Usagef("--log-level %q: want debug, info, warn or error", l.Level)
	}
	if l.Format != "text" && l.Format != "json" {
		return Usagef("--log-format %q: want text or json", l.Format)
	}
	return nil
}

// Logger builds the logger. Every record passes through redaction, so a
// secret inside a library's error never reaches the log.
func (l *Logging) Logger(w io.Writer) (*slog.Logger, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.Level)) // checked by Validate
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: redactAttr}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func redactAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); s != "" {
			if r := redact.String(s); r != s {
				return slog.String(a.Key, r)
			}
		}
	case slog.KindDuration:
		// "1m30s", not slog's nanoseconds: log pipelines and people read it.
		return slog.String(a.Key, a.Value.Duration().String())
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok && err != nil {
			return slog.String(a.Key, redact.String(err.Error()))
		}
	}
	return a
}

// SignalContext is cancelled on the first SIGINT or SIGTERM: the binary
// stops gracefully. The signals' default action returns then, so a second
// one ends the process at once (the entries in flight stay pending, safe to
// redeliver).
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// Fail prints err for a human and returns the exit code: ExitOK for
// flag.ErrHelp (the usage was asked for and printed), ExitUnavailable for an
// UnavailableError, ExitError for anything else. prog is the command as
// typed ("pelguard-consumer cap set"). When the command was asked for JSON
// logs (see Program.Main), the error is one JSON log line instead, so the
// last line of a failed start does not break a log pipeline.
func Fail(stderr io.Writer, prog string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	code := ExitError
	var unavailable *UnavailableError
	if errors.As(err, &unavailable) {
		code = ExitUnavailable
	}
	msg := redact.String(trimOwnPrefix(prog, trimLibraryPrefix(err.Error())))
	var ue *UsageError
	isUsage := errors.As(err, &ue)
	if js, ok := stderr.(jsonStderr); ok {
		attrs := []any{slog.String("command", prog), slog.String("error", msg), slog.Int("exit_code", code)}
		if isUsage && ue.Synopsis != "" {
			attrs = append(attrs, slog.String("usage", ue.Synopsis))
		}
		slog.New(slog.NewJSONHandler(js.Writer, &slog.HandlerOptions{ReplaceAttr: redactAttr})).
			Error("cannot continue", attrs...)
		return code
	}
	fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
	if isUsage {
		if ue.Synopsis != "" {
			fmt.Fprintf(stderr, "Usage: %s\n", ue.Synopsis)
		}
		fmt.Fprintf(stderr, "Run '%s --help' for the flags.\n", prog)
	}
	return code
}

// trimOwnPrefix drops what Fail is about to print anyway: an error that
// starts "chaos: " from the chaos command, or "consumer: " from
// pelguard-consumer, would read "chaos: chaos: …".
func trimOwnPrefix(prog, msg string) string {
	bin, _, _ := strings.Cut(prog, " ")
	for {
		trimmed := strings.TrimPrefix(strings.TrimPrefix(msg, bin+": "), strings.TrimPrefix(bin, "pelguard-")+": ")
		if trimmed == msg {
			return msg
		}
		msg = trimmed
	}
}
