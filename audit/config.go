// Package audit is pelguard's reconciliation auditor, the last line of
// defence: it diffs the Stripe charges created in a window against the
// ledger, records every discrepancy in audit_findings (once: a rerun adds
// nothing and a resolved finding stays resolved), alerts with the new ones,
// and refunds duplicate charges when told to, never the canonical one
// (invariant 6).
//
// The library is what the auditor binary, its tests and the drill call:
// New(cfg), then Run(ctx, Window) and Refund(ctx, RefundOptions).
package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/stripeapi"
)

// Defaults applied by New.
const (
	// DefaultSettleDelay keeps a run away from charges still being recorded:
	// a consumer writes the ledger after Stripe answers, so the newest
	// minutes would otherwise look like orphans.
	DefaultSettleDelay = 10 * time.Minute
	// NoSettleDelay, as Config.SettleDelay, audits up to now (River's -1
	// for "disabled"): the zero value takes DefaultSettleDelay.
	NoSettleDelay time.Duration = -1
	// DefaultOverlap is how far each run reaches back before the previous
	// checkpoint, so a charge created near the boundary is seen twice rather
	// than never (findings are idempotent, so twice costs nothing).
	DefaultOverlap = time.Hour
	// DefaultInitialLookback is the window of the very first run.
	DefaultInitialLookback = 7 * 24 * time.Hour
	// DefaultChargeLag bounds how long before its ledger charged_at a
	// charge may have been created (one Stripe call with retries); the
	// missing-charge check lists that much before the window.
	DefaultChargeLag = 30 * time.Minute
	// DefaultStuckAfter is how long a pending row may sit without a live
	// lease before it is a stuck_pending finding.
	DefaultStuckAfter = time.Hour
	// DefaultStuckProcessingAfter is how long a processing row (a bank
	// debit in motion) may wait for its settlement before it is a
	// stuck_pending finding. The slowest debits Stripe offers take up to
	// 14 business days to succeed or fail (SEPA Direct Debit; ACH and
	// Bacs take under a week), which is about 20 calendar days with
	// weekends: three weeks passes every honest settlement, and still
	// reports a row nobody settles within the month's billing.
	DefaultStuckProcessingAfter = 21 * 24 * time.Hour
	// DefaultParallel is how many sub-windows are listed at once.
	DefaultParallel = 4
	// DefaultLookupBatch is how many ledger keys one query reads.
	DefaultLookupBatch = 5000
	// DefaultPeriodGrace is how long after its month a billing period may
	// still be charged; Window.Period spans the month plus this.
	DefaultPeriodGrace = 45 * 24 * time.Hour
	// DefaultLegacyPattern matches the naive consumer's descriptions
	// ("Usage billing for 2026-11"); its first group is the period.
	DefaultLegacyPattern = `^Usage billing for (\S+)$`
	// DefaultMaxRefunds and DefaultMaxCents are the per-run refund caps.
	DefaultMaxRefunds = 10
	// DefaultMaxCents is 1,000.00 in minor units.
	DefaultMaxCents int64 = 100_000
	// DefaultMaxRefunds24h and DefaultMaxCents24h are the rolling caps: at
	// most 30 refunds and 3,000.00 in minor units in any 24 h, over every
	// refund pelguard makes (three full runs at the per-run defaults).
	DefaultMaxRefunds24h = 30
	// DefaultMaxCents24h is 3,000.00 in minor units.
	DefaultMaxCents24h int64 = 300_000
	// DefaultProgressInterval is how often progress is written.
	DefaultProgressInterval = time.Second
	// DefaultCommandName is how the alert spells the refund command.
	DefaultCommandName = cmdname.Auditor
)

// Config configures an Auditor. DB and Stripe.APIKey are required.
type Config struct {
	// DB reaches the ledger and the audit tables; required.
	DB *pgxpool.Pool
	// Schema holds pelguard's tables (default "pelguard"); it must match the
	// consumers'.
	Schema string
	// Stripe configures the Stripe adapter the Auditor builds (its
	// RateLimit is the client-side limit every page waits on). The Auditor
	// wraps Stripe.HTTPClient to count pages; it never mutates it.
	Stripe stripeapi.Config
	// Notifier receives one summary per run with new findings; nil sends
	// nothing.
	Notifier alerts.Notifier
	// Logger; nil discards.
	Logger *slog.Logger
	// Clock is "now" for windows and stuck rows; nil is the wall clock.
	Clock clock.Clock
	// TracerProvider makes a pelguard.audit_run span per Run. nil: the
	// global provider, a no-op unless the binary installed the SDK.
	TracerProvider trace.TracerProvider

	// SettleDelay keeps a window's end this far behind now; 0 takes
	// DefaultSettleDelay, NoSettleDelay none (`auditor run --settle-delay
	// 0`).
	SettleDelay     time.Duration
	Overlap         time.Duration
	InitialLookback time.Duration
	ChargeLag       time.Duration
	StuckAfter      time.Duration
	// StuckProcessingAfter is how long a processing row may wait for its
	// debit's settlement before it is stuck_pending (default
	// DefaultStuckProcessingAfter). A remembered debit the auditor finds
	// final while its row is still processing is reported at once,
	// whatever this says.
	StuckProcessingAfter time.Duration
	PeriodGrace          time.Duration
	// Parallel is the number of sub-windows listed concurrently.
	Parallel int
	// LookupBatch is the number of ledger keys read per query.
	LookupBatch int
	// LockWait is how long Run waits for another run to finish; 0 skips at
	// once with ErrLocked.
	LockWait time.Duration
	// LockLease is how long a run's lock lasts unless its heartbeat renews
	// it (every third of it): how long a killed run keeps the next one
	// waiting at most. 0 takes DefaultLockLease.
	LockLease time.Duration

	// Legacy also audits charges without the pelguard marker, grouped by
	// Stripe customer and billing period; only duplicates are reported.
	Legacy bool
	// OneCustomerPerStripeCustomer, with Legacy, is the operator's word
	// that the team bills each Stripe customer for exactly one of its
	// customers. Without it, two unmarked charges of one amount on a Stripe
	// customer that neither the ledger nor pelguard's charges tie to a team
	// customer are ambiguous_legacy (shown, never refunded): they may be
	// two customers' only charges.
	OneCustomerPerStripeCustomer bool
	// ExternalLedger, with Legacy, names a team's own table (schema.table,
	// the article's billing_records) that keeps the canonical record: the
	// charge it names for a customer and period is never refunded, and a
	// second charge of the same Stripe customer and period is the
	// duplicate. Only read.
	ExternalLedger string
	// LegacyPattern extracts the period from a legacy charge's description
	// when its metadata has no billing_period; it must have one group.
	LegacyPattern string

	// AutoRefund refunds open duplicates at the end of each run, within
	// MaxRefunds and MaxCents.
	AutoRefund bool
	MaxRefunds int
	MaxCents   int64
	// MaxRefunds24h and MaxCents24h are the rolling refund caps (default
	// DefaultMaxRefunds24h, DefaultMaxCents24h): refunds pelguard made in
	// the last 24 h, persisted in refund_ledger and shared by every run and
	// every process that refunds; a refund that would pass either is
	// skipped. Sums of cents add minor units across currencies, as the
	// per-run cap does.
	MaxRefunds24h int
	MaxCents24h   int64

	// Usage configures the reconciliation of Stripe's meter totals with
	// the meter ledger (usage.go; ReconcileUsage).
	Usage UsageConfig

	// Test holds hooks for tests only; production leaves it zero.
	// Witness is the process's ledger witness (pelguard's binaries give
	// their internal/rollback monitor): a recorded refund bumps it, and
	// while the ledger is being repaired after a rollback no refund is made.
	Witness LedgerWitness

	Test TestConfig

	// Progress, when set, receives a one-line progress report every
	// ProgressInterval during the listing (a terminal's stderr).
	Progress         io.Writer
	ProgressInterval time.Duration
	// CommandName prefixes the refund command in alerts.
	CommandName string
}

func (c Config) withDefaults() Config {
	switch c.SettleDelay {
	case 0:
		c.SettleDelay = DefaultSettleDelay
	case NoSettleDelay:
		c.SettleDelay = 0
	}
	c.Overlap = cmp.Or(c.Overlap, DefaultOverlap)
	c.InitialLookback = cmp.Or(c.InitialLookback, DefaultInitialLookback)
	c.ChargeLag = cmp.Or(c.ChargeLag, DefaultChargeLag)
	c.StuckAfter = cmp.Or(c.StuckAfter, DefaultStuckAfter)
	c.StuckProcessingAfter = cmp.Or(c.StuckProcessingAfter, DefaultStuckProcessingAfter)
	c.PeriodGrace = cmp.Or(c.PeriodGrace, DefaultPeriodGrace)
	c.Parallel = cmp.Or(c.Parallel, DefaultParallel)
	c.LookupBatch = cmp.Or(c.LookupBatch, DefaultLookupBatch)
	c.LegacyPattern = cmp.Or(c.LegacyPattern, DefaultLegacyPattern)
	c.MaxRefunds = cmp.Or(c.MaxRefunds, DefaultMaxRefunds)
	c.MaxCents = cmp.Or(c.MaxCents, DefaultMaxCents)
	c.MaxRefunds24h = cmp.Or(c.MaxRefunds24h, DefaultMaxRefunds24h)
	c.MaxCents24h = cmp.Or(c.MaxCents24h, DefaultMaxCents24h)
	c.ProgressInterval = cmp.Or(c.ProgressInterval, DefaultProgressInterval)
	c.LockLease = cmp.Or(c.LockLease, DefaultLockLease)
	c.CommandName = cmp.Or(c.CommandName, DefaultCommandName)
	c.Usage = c.Usage.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Clock = clock.Or(c.Clock)
	return c
}

// Validate reports a configuration that cannot work. Stripe settings are
// checked by the adapter when New builds it.
func (c Config) Validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("a Postgres pool (DB) is required"))
	}
	if c.Schema != "" {
		if err := pg.ValidSchema(c.Schema); err != nil {
			errs = append(errs, err)
		}
	}
	// Each setting is named as pelguard-auditor's flag for it, which is
	// what an operator typed; the few without a flag by their field.
	for _, d := range []struct {
		name string
		d    time.Duration
	}{
		{"--overlap", c.Overlap}, {"--initial-lookback", c.InitialLookback}, {"ChargeLag", c.ChargeLag},
		{"--stuck-after", c.StuckAfter}, {"--stuck-processing-after", c.StuckProcessingAfter}, {"PeriodGrace", c.PeriodGrace},
		{"--lock-wait", c.LockWait}, {"--lock-lease", c.LockLease}, {"ProgressInterval", c.ProgressInterval},
	} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s %s: want 0 or more", d.name, d.d))
		}
	}
	if c.LockLease != 0 && c.LockLease < MinLockLease {
		errs = append(errs, fmt.Errorf("--lock-lease %s: want at least %s (0: %s), so that a heartbeat has time to renew it", c.LockLease, MinLockLease, DefaultLockLease))
	}
	if c.SettleDelay < 0 && c.SettleDelay != NoSettleDelay {
		errs = append(errs, fmt.Errorf("--settle-delay %s: want 0 or more (0: audit up to now)", c.SettleDelay))
	}
	if c.Parallel < 0 || c.Parallel > 64 {
		errs = append(errs, fmt.Errorf("--parallel %d: want 1 to 64", c.Parallel))
	}
	if c.LookupBatch < 0 {
		errs = append(errs, fmt.Errorf("LookupBatch %d: want 0 (the default) or more", c.LookupBatch))
	}
	if c.MaxRefunds < 0 || c.MaxCents < 0 {
		errs = append(errs, fmt.Errorf("--max-refunds %d, --max-cents %d: want 0 or more", c.MaxRefunds, c.MaxCents))
	}
	if c.MaxRefunds24h < 0 || c.MaxCents24h < 0 {
		errs = append(errs, fmt.Errorf("--max-refunds-24h %d, --max-cents-24h %d: want 0 (the default) or more", c.MaxRefunds24h, c.MaxCents24h))
	}
	if err := c.Usage.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ExternalLedger != "" {
		if !c.Legacy {
			errs = append(errs, errors.New("--external-ledger needs --legacy: the team's charges carry no pelguard marker"))
		}
		if _, err := pg.TeamTable("--external-ledger", c.ExternalLedger); err != nil {
			errs = append(errs, err)
		}
	}
	if c.LegacyPattern != "" {
		re, err := regexp.Compile(c.LegacyPattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("--legacy-pattern %q: %w", c.LegacyPattern, err))
		} else if re.NumSubexp() < 1 {
			errs = append(errs, fmt.Errorf("--legacy-pattern %q needs a group that captures the period, such as %q", c.LegacyPattern, DefaultLegacyPattern))
		}
	}
	return errors.Join(errs...)
}

// TestConfig holds hooks that let tests drive interleavings without sleeps.
type TestConfig struct {
	// BeforeRefund runs right before a refund's POST, with the key's ledger
	// lock and the refund ledger's lock held and both charges re-read.
	BeforeRefund func(Finding)
	// AfterUsageCorrectionRecorded runs once a usage correction is
	// recorded, before its first call; an error ends the run there (a
	// crash between the record and the call).
	AfterUsageCorrectionRecorded func(UsageCorrection) error
}

// Window is the span of charge creation times a run audits. The zero Window
// means "from the last checkpoint (minus the overlap) to now minus the
// settle delay".
type Window struct {
	From, To time.Time
	// Period, when set, limits findings to that billing period (YYYY-MM);
	// without From/To the window is the period's month plus PeriodGrace.
	Period string
}

// Manual reports whether an operator chose the window: such runs do not
// move the checkpoint.
func (w Window) Manual() bool { return !w.From.IsZero() || !w.To.IsZero() || w.Period != "" }

// Errors callers branch on.
var (
	// ErrLocked: another run (or refund) holds the lease (lock.go).
	ErrLocked = errors.New("another audit run is in progress")
	// ErrEmptyWindow: the window holds no time (e.g. the checkpoint is
	// already at now minus the settle delay).
	ErrEmptyWindow = errors.New("empty audit window")
	// ErrNotFound: no such finding.
	ErrNotFound = errors.New("no such finding")
	// ErrState: the finding is not in a state that allows the change.
	ErrState = errors.New("finding state does not allow this")
)

// LedgerWitness is the ledger's witness as the auditor uses it (the same
// methods as consumer.LedgerWitness; DESIGN.md "The ledger's own losses").
type LedgerWitness interface {
	Writer() string
	Committed(seq int64)
	Mirror(ctx context.Context) error
	Suspect() bool
}
