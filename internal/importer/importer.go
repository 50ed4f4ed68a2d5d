// Package importer is `consumer import`: it brings what a team billed before
// pelguard (its own billing_records table, and Stripe itself) into pelguard's
// ledger, so that nothing the team billed is charged again after the switch.
//
// It only ever reads the team's data (the table in a READ ONLY transaction),
// verifies every charge at Stripe, and writes pelguard's schema alone: ledger
// rows (terminal, never leased), duplicate findings, the import run and the
// periods that now have imported history. A rerun changes nothing.
//
// Where each ledger column comes from:
//   - customer_id, billing_period: the team's row, or (a charge found only at
//     Stripe) the Stripe customer mapped through the team's table or the
//     stream's events, and the period from metadata or the description;
//   - stripe_customer_id, amount_cents, currency: the charge at Stripe; for a
//     declined row without a charge, the stream's event for that key (none
//     found: reported, not imported);
//   - idempotency_key: the content hash under the namespace pelguard will
//     run with (--namespace);
//   - first_attempt_at: the charge's creation time, or the team's created_at
//     when that is earlier; charged_at: the charge's creation time.
package importer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/stripeapi"
)

// DefaultDescription is the article's charge description; {period} stands
// for the billing period.
const DefaultDescription = "Usage billing for {period}"

// Config configures one import.
type Config struct {
	DB     *pgxpool.Pool // required
	Schema string        // pelguard's schema (default pelguard)
	// Stripe reads charges (GET and list only); required.
	Stripe *stripeapi.Client
	// Namespace is the one pelguard will run with: it is in every imported
	// idempotency key.
	Namespace string

	// FromTable is the team's table (schema-qualified, e.g.
	// public.billing_records) with the article's columns; FromQuery is a
	// query returning the same columns by name. Either, both or none (with
	// FromStripe).
	FromTable string
	FromQuery string
	// FromStripe lists Period's succeeded charges: those without pelguard's
	// marker (the team's old consumer's) and pelguard's own (after a
	// ledger restored from a backup).
	FromStripe bool
	// Period limits the import to one billing period; required with
	// FromStripe.
	Period string
	// Description is the template of the team's description; default
	// DefaultDescription.
	Description string
	// Events are the stream's events: they map Stripe customers to the
	// team's customer ids and give declined rows their amount.
	Events []event.Event

	DryRun   bool
	Progress io.Writer    // optional: a line per 1,000 rows and per phase
	Logger   *slog.Logger // optional
	Now      func() time.Time
}

// Problem is something the import did not import, and why.
type Problem struct {
	CustomerID    string `json:"customer_id,omitempty"`
	BillingPeriod string `json:"billing_period,omitempty"`
	ChargeID      string `json:"charge_id,omitempty"`
	Reason        string `json:"reason"`
}

// Duplicate is a second charge for one key: it becomes a duplicate_charge
// finding; the canonical one is the ledger's row.
type Duplicate struct {
	CustomerID        string `json:"customer_id"`
	BillingPeriod     string `json:"billing_period"`
	ChargeID          string `json:"charge_id"`
	CanonicalChargeID string `json:"canonical_charge_id"`
	AmountCents       int64  `json:"amount_cents"`
	Currency          string `json:"currency"`
	StripeCustomerID  string `json:"stripe_customer_id"`
}

// Summary is what one import did (or, with DryRun, would do).
type Summary struct {
	DryRun bool  `json:"dry_run"`
	RunID  int64 `json:"run_id,omitempty"`
	// TeamRows and StripeCharges are what was read.
	TeamRows      int `json:"team_rows"`
	StripeCharges int `json:"stripe_charges"`
	// Imported counts new ledger rows by status.
	ImportedCharged  int `json:"imported_charged"`
	ImportedDeclined int `json:"imported_declined"`
	// AlreadyInLedger: keys the ledger had with the same outcome (a rerun).
	AlreadyInLedger int `json:"already_in_ledger"`
	// Repaired: keys the ledger had as pending or processing (a failover
	// took them back from charged, or their charge was never recorded)
	// whose charge Stripe has: now charged with it, under a new epoch.
	Repaired   int         `json:"repaired"`
	Skipped    []Problem   `json:"skipped"`
	Conflicts  []Problem   `json:"conflicts"`
	Duplicates []Duplicate `json:"duplicates"`
	Periods    []string    `json:"periods"`
}

// TeamRow is one row of the team's table (the article's columns).
type TeamRow struct {
	CustomerID    string     `db:"customer_id"`
	BillingPeriod string     `db:"billing_period"`
	ChargeID      *string    `db:"charge_id"`
	AmountCents   *int64     `db:"amount_cents"`
	Status        string     `db:"status"`
	Error         *string    `db:"error"`
	CreatedAt     *time.Time `db:"created_at"`
}

func (c *Config) validate() error {
	switch {
	case c.DB == nil:
		return errors.New("import: a Postgres pool is required")
	case c.Stripe == nil:
		return errors.New("import: a Stripe client is required (charges are verified at Stripe)")
	case c.FromTable == "" && c.FromQuery == "" && !c.FromStripe:
		return errors.New("import: nothing to import from: give --from-table, --from-query or --from-stripe")
	case c.FromStripe && c.Period == "":
		return errors.New("import: --from-stripe needs --period (the billing period to list, e.g. 2026-11)")
	case c.Namespace == "":
		return errors.New("import: --namespace is required: the namespace pelguard will run with (the common pattern's: redis-streams-billing)")
	}
	if c.Period != "" {
		if _, err := time.Parse("2006-01", c.Period); err != nil {
			return fmt.Errorf("import: --period %q: want YYYY-MM", c.Period)
		}
	}
	if c.FromTable != "" {
		if _, err := tableIdent(c.FromTable); err != nil {
			return err
		}
	}
	if c.Description != "" && !strings.Contains(c.Description, "{period}") {
		return fmt.Errorf("import: --description %q must contain {period}", c.Description)
	}
	return nil
}

// tableIdent parses schema.table (or table) into a quoted identifier.
func tableIdent(name string) (pgx.Identifier, error) {
	return pg.TeamTable("import: --from-table", name)
}

// keyed is everything known about one (customer, period).
type keyed struct {
	key      ledger.Key
	team     *TeamRow
	teamCh   string // the charge the team's table names, verified
	charges  []stripeapi.Charge
	canon    stripeapi.Charge // the key's canonical charge (decide)
	event    *event.Event
	problems []string
}

// Run imports. What could not be imported is in the Summary, not an error.
// An error part-way leaves the periods marked as having imported history
// (written first) and the rows written so far: a rerun completes it, and
// meanwhile the consumer asks Stripe before charging in those periods.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if err := cfg.validate(); err != nil {
		return Summary{}, err
	}
	cfg.Description = cmp.Or(cfg.Description, DefaultDescription)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &run{cfg: cfg, keys: map[ledger.Key]*keyed{}, db: pg.NewDB(cfg.DB, cfg.Schema), sum: Summary{DryRun: cfg.DryRun}}
	if err := r.collect(ctx); err != nil {
		return r.sum, err
	}
	recs, dups := r.decide()
	if err := r.write(ctx, recs, dups); err != nil {
		return r.sum, err
	}
	return r.sum, nil
}

type run struct {
	cfg  Config
	db   pg.DB
	keys map[ledger.Key]*keyed
	sum  Summary
}

func (r *run) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "import: "+format+"\n", args...)
	}
}

func (r *run) get(k ledger.Key) *keyed {
	e, ok := r.keys[k]
	if !ok {
		e = &keyed{key: k}
		r.keys[k] = e
	}
	return e
}

func (r *run) skip(k ledger.Key, charge, reason string) {
	r.sum.Skipped = append(r.sum.Skipped, Problem{CustomerID: k.CustomerID, BillingPeriod: k.BillingPeriod, ChargeID: charge, Reason: reason})
}
