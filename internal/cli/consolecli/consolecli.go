// Package consolecli is the console binary's command line (pelguard-console):
// serve, hash-password and migrate, their options and Validate. cmd/console
// only hands it the arguments, the signals and the exit code; tests call
// Main directly.
package consolecli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/console"
	"github.com/pelguard/pelguard/stripelimit"
)

// prog is the installed name (make install, the image, the units): help
// and errors use it so that what they print can be typed as it is. role
// is the short name in metrics (pelguard_build_info{role}) and traces.
const (
	role = "console"
	prog = cmdname.Console
)

// DefaultListen is loopback: the console is reachable from elsewhere only
// when told so.
const DefaultListen = "127.0.0.1:9470"

// Main runs the console's command line and returns the exit code: 0
// stopped cleanly, 2 bad flags or configuration, 3 Redis or Postgres
// unreachable after --wait-for-deps.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program().Main(ctx, args, stdout, stderr)
}

func program() *cli.Program {
	return &cli.Program{Name: prog, Commands: []cli.Command{
		{Name: "serve", Args: "[flags]", Summary: "serve the console until SIGTERM/SIGINT", Run: serveCmd},
		{Name: "hash-password", Args: "", Summary: "read a password on stdin, print its bcrypt hash for the users file", Run: hashCmd},
		{Name: "migrate", Args: "up|down|status|move", Summary: "apply, roll back, list or move the ledger's migrations",
			Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return cli.Migrate(ctx, prog, args, stdout, stderr)
			}},
	}}
}

const serveDescription = `Serves pelguard's console: the ledger's outcomes, the PEL and dead letters of each stream, spend
caps, the last audit run, the findings (filter, open one, see its charges at Stripe), one
customer's period (ledger row, findings, charges, stream entries). Read-only unless
--allow-actions: then a finding can be refunded (the auditor's refund path, within the rolling
24 h cap every refunder shares), dismissed or resolved, dead letters replayed (the consumer's
replay path), and a stream's billing paused or resumed (as 'pelguard-consumer pause' does), each
after a confirmation page with a required reason, recorded in
console_actions (who, when, what, why) and sent to Slack.

Identity is required: --users-file (name:bcrypt-hash lines; make a hash with
'pelguard-console hash-password') or --proxy-user-header from --trusted-proxy addresses. It listens on
loopback unless --listen says otherwise; a users-file login on another address needs
--tls-cert/--tls-key (passwords are not sent in clear).

Stripe permissions (a restricted key, optional): Charges Read shows each charge as Stripe has it
now; Refunds Write only with --allow-actions (no key: no refunds).
Exit status: 0 stopped cleanly, 2 bad flags or configuration, 3 Redis or Postgres unreachable.`

// ServeOptions are the flags of `console serve`.
type ServeOptions struct {
	Listen          string
	UsersFile       string
	ProxyUserHeader string
	TrustedProxies  []string
	AllowActions    bool
	TLSCert, TLSKey string

	RedisURL, DatabaseURL, Schema string
	Streams                       cli.Streams
	MeterStreams                  cli.Streams
	Group                         string
	WaitForDeps                   time.Duration
	ShutdownTimeout               time.Duration
	MaxRefundCents                int64
	MaxRefunds24h                 int
	MaxCents24h                   int64
	Log                           cli.Logging
	Stripe                        cli.Stripe
	Slack                         cli.Slack
	Live                          LiveOptions

	proxies      []netip.Prefix
	streams      []cli.StreamGroup
	meterStreams []cli.StreamGroup
}

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

func (o *ServeOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", cli.Env("PELGUARD_CONSOLE_LISTEN", DefaultListen), "address to serve on; loopback by default [PELGUARD_CONSOLE_LISTEN]")
	fs.StringVar(&o.UsersFile, "users-file", cli.Env("PELGUARD_CONSOLE_USERS_FILE", ""), "file of name:bcrypt-hash lines, one per person [PELGUARD_CONSOLE_USERS_FILE]")
	fs.StringVar(&o.ProxyUserHeader, "proxy-user-header", "", "header naming the user, set by an authenticating reverse proxy (e.g. X-Forwarded-User); needs --trusted-proxy")
	fs.Var((*listFlag)(&o.TrustedProxies), "trusted-proxy", "address or CIDR of the proxy whose user header is believed; repeatable")
	fs.BoolVar(&o.AllowActions, "allow-actions", false, "allow refund, dismiss, resolve, replay, pause and resume (default: read-only)")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "TLS certificate file (with --tls-key)")
	fs.StringVar(&o.TLSKey, "tls-key", "", "TLS key file")
	cli.RegisterRedis(fs, &o.RedisURL)
	cli.RegisterDatabase(fs, &o.DatabaseURL)
	cli.RegisterSchema(fs, &o.Schema)
	cli.RegisterStreams(fs, &o.Streams, &o.Group, "show")
	fs.Var(&o.MeterStreams, "meter-stream", "meter-event stream to show (the streams of pelguard-consumer meter-events), repeatable: name (with --group) or name=group;\n"+
		"its PEL page judges entries against the meter ledger")
	cli.RegisterWait(fs, &o.WaitForDeps)
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long requests in flight (an action) may take")
	fs.Int64Var(&o.MaxRefundCents, "max-refund-cents", audit.DefaultMaxCents, "most minor units one console refund refunds")
	fs.IntVar(&o.MaxRefunds24h, "max-refunds-24h", audit.DefaultMaxRefunds24h, "the rolling cap shared with 'pelguard-auditor refund': refunds in any 24 h (persisted in refund_ledger)")
	fs.Int64Var(&o.MaxCents24h, "max-cents-24h", audit.DefaultMaxCents24h, "the rolling cap shared with 'pelguard-auditor refund': minor units in any 24 h")
	o.Log.Register(fs)
	o.Stripe.Register(fs)
	o.Slack.Register(fs)
	o.Live.register(fs)
}

// Validate checks the flags before anything is built.
func (o *ServeOptions) Validate() error {
	if err := o.Log.Validate(); err != nil {
		return err
	}
	if err := o.Live.validate(); err != nil {
		return err
	}
	if err := cli.ValidateWait(o.WaitForDeps); err != nil {
		return err
	}
	switch {
	case o.UsersFile == "" && o.ProxyUserHeader == "":
		return cli.Usagef("no identity: give --users-file or --proxy-user-header with --trusted-proxy (the console has no anonymous mode)")
	case o.UsersFile != "" && o.ProxyUserHeader != "":
		return cli.Usagef("give --users-file or --proxy-user-header, not both")
	case o.ProxyUserHeader != "" && len(o.TrustedProxies) == 0:
		return cli.Usagef("--proxy-user-header needs --trusted-proxy: a header anyone can send is not an identity")
	case (o.TLSCert == "") != (o.TLSKey == ""):
		return cli.Usagef("--tls-cert and --tls-key go together")
	case o.MaxRefundCents <= 0 || o.MaxRefunds24h <= 0 || o.MaxCents24h <= 0:
		return cli.Usagef("--max-refund-cents, --max-refunds-24h and --max-cents-24h must be positive")
	}
	o.proxies = nil
	for _, p := range o.TrustedProxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return cli.Usagef("--trusted-proxy %q: want an address or a CIDR", p)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		o.proxies = append(o.proxies, pfx)
	}
	host, _, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return cli.Usagef("--listen %q: want host:port", o.Listen)
	}
	if o.UsersFile != "" && o.TLSCert == "" && !loopback(host) {
		return cli.Usagef("--listen %s is not loopback: a users-file login there needs --tls-cert and --tls-key (or put the console behind an authenticating proxy)", o.Listen)
	}
	if o.Stripe.APIKey != "" {
		if err := o.Stripe.Validate(); err != nil {
			return err
		}
	}
	if o.streams, err = o.Streams.Resolve(o.Group); err != nil {
		return err
	}
	if len(o.MeterStreams) > 0 {
		if o.meterStreams, err = o.MeterStreams.Resolve(o.Group); err != nil {
			return fmt.Errorf("--meter-stream: %w", err)
		}
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " serve"
	fs := cli.NewFlagSet(name, name+" --users-file FILE | --proxy-user-header H --trusted-proxy CIDR [flags]",
		serveDescription+"\n\n"+program().CommandList(), stderr)
	var o ServeOptions
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := o.serve(ctx, stderr); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return cli.ExitOK
}

func (o *ServeOptions) serve(ctx context.Context, stderr io.Writer) error {
	logger, err := o.Log.Logger(stderr)
	if err != nil {
		return err
	}
	cli.RouteLibraryLogs(logger)
	cfg := console.Config{Schema: o.Schema, ProxyUserHeader: o.ProxyUserHeader, TrustedProxies: o.proxies,
		AllowActions: o.AllowActions, MaxRefundCents: o.MaxRefundCents, Logger: logger, SecureCookies: o.TLSCert != ""}
	o.Live.apply(&cfg)
	if o.UsersFile != "" {
		f, err := os.Open(o.UsersFile)
		if err != nil {
			return cli.Usagef("--users-file: %v", err)
		}
		cfg.Users, err = console.LoadUsers(f)
		_ = f.Close()
		if err != nil {
			return cli.Usagef("--users-file %s: %v", o.UsersFile, err)
		}
	}
	for _, sg := range o.streams {
		cfg.Streams = append(cfg.Streams, console.Stream{Name: sg.Stream, Group: sg.Group})
	}
	for _, sg := range o.meterStreams {
		cfg.Streams = append(cfg.Streams, console.Stream{Name: sg.Stream, Group: sg.Group, Meter: true})
	}
	if err := cli.CheckSchemaFlag(o.DatabaseURL, o.Schema); err != nil {
		return err
	}
	rdb, rdep, err := cli.NewRedis(o.RedisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	n, err := o.Slack.Notifier(logger, nil)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = n.Close(cctx)
	}()
	mon, err := cli.NewRollback("console", "", o.Schema, rdb, n, logger, nil)
	if err != nil {
		return err
	}
	pool, pdep, err := cli.NewDB(o.DatabaseURL, 8, mon.AfterConnect)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer mon.Close() // before the pool closes
	cfg.DB, cfg.Redis = pool, rdb
	cfg.Notifier = n
	if o.Stripe.APIKey != "" {
		// The console's re-reads and refunds are paced like the auditor's
		// (--stripe-rate, shared through Redis with every process of the role).
		share := cli.Share{Role: stripelimit.RoleAudit, Redis: rdb, Logger: logger}
		if cfg.Stripe, err = o.Stripe.Client(logger, nil, share); err != nil {
			return err
		}
		lim, err := o.Stripe.Limiter(share)
		if err != nil {
			return err
		}
		cfg.TestMode = strings.Contains(o.Stripe.APIKey, "_test_")
		cfg.Auditor, err = audit.New(audit.Config{DB: pool, Schema: o.Schema, Logger: logger, Notifier: n,
			MaxRefunds24h: o.MaxRefunds24h, MaxCents24h: o.MaxCents24h, MaxCents: o.MaxRefundCents,
			Stripe: o.Stripe.Config(lim), Witness: mon})
		if err != nil {
			return cli.Usagef("%v", err)
		}
	} else if o.AllowActions {
		logger.Warn("no Stripe key: the console offers no refunds (dismiss, resolve and replay only)")
	}
	srv, err := console.New(cfg)
	if err != nil {
		return cli.Usagef("%v", err)
	}
	if err := (cli.Waiter{For: o.WaitForDeps, Logger: logger}).Wait(ctx, pdep, rdep); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := cli.CheckSchema(ctx, prog, pool, o.Schema); err != nil {
		return err
	}
	// The PEL page's verdicts compute keys and identifiers: with another
	// namespace than the streams' it would show "no row → claim" for
	// delivered events. The console only reads: it records nothing.
	agree := cli.Agreement{Namespace: o.Live.Namespace, Streams: append(cli.ChargeStreams(o.streams), cli.UsageStreams(o.meterStreams)...)}
	if err := agree.Check(ctx, pool, rdb, o.Schema); err != nil {
		return err
	}
	cli.ReportDurability(ctx, pool, logger, nil)
	if err := mon.Start(ctx, pool); err != nil {
		logger.Warn("checking the ledger for a rollback at start", "err", err)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return cli.Usagef("--listen %s: %v", o.Listen, err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 3 * time.Minute, IdleTimeout: time.Minute}
	done := make(chan error, 1)
	go func() {
		if o.TLSCert != "" {
			done <- hs.ServeTLS(ln, o.TLSCert, o.TLSKey)
		} else {
			done <- hs.Serve(ln)
		}
	}()
	logger.Info("console serving", slog.String("addr", ln.Addr().String()), slog.Bool("allow_actions", o.AllowActions),
		slog.Bool("refunds", cfg.Auditor != nil), slog.Bool("tls", o.TLSCert != ""))
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	return hs.Shutdown(sctx)
}

func hashCmd(_ context.Context, args []string, stdout, stderr io.Writer) int {
	name := prog + " hash-password"
	fs := cli.NewFlagSet(name, name+" < password", "Reads one password line on stdin and prints its bcrypt hash: put `name:HASH` in the users file.", stderr)
	if err := cli.Parse(fs, args); err != nil {
		return cli.Fail(stderr, name, err)
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return cli.Fail(stderr, name, err)
	}
	pw := strings.TrimRight(line, "\r\n")
	if len(pw) < 12 {
		return cli.Fail(stderr, name, cli.Usagef("the password must have at least 12 characters"))
	}
	h, err := bcrypt.GenerateFromPassword([]byte(pw), 12)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	fmt.Fprintln(stdout, string(h))
	return cli.ExitOK
}
