package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/importer"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/streamfacts"
	"github.com/pelguard/pelguard/stripelimit"
)

const importHelp = `Brings what your existing consumer already billed into pelguard's ledger, before pelguard
bills anything, so that no customer is charged twice across the switch. Sources, combinable:

  --from-table public.billing_records   the team's table (the common columns: customer_id,
                                        billing_period, charge_id, amount_cents, status, error,
                                        created_at)
  --from-query 'SELECT …'               another shape, returning those columns by name
  --from-stripe --period 2026-11        the period's succeeded charges at Stripe, with or without
                                        pelguard's marker (charges the team made but never
                                        recorded: killed between Stripe's reply and its INSERT;
                                        pelguard's own after a ledger restored from a backup)

Every charge is verified at Stripe (amount, currency, customer, status) and recorded charged
with its real charge id; declined rows become declined; two charges for one key become one row
and a duplicate_charge finding (the charge the team's table names stays canonical). A key the
ledger has as pending or processing (a Postgres failover or a restore took it back from charged)
whose charge Stripe has is repaired: recorded charged with it, under a new epoch, so an old lease
holder can never write it again; a key whose charges are all refunded stays a conflict. The team's
data is only read (table and query run in READ ONLY transactions). --stream lets the import
read the stream's events: they map Stripe customers to your customer ids and give declined rows
their amount. Run it with the --namespace pelguard will run with (the common pattern's:
redis-streams-billing). A rerun changes nothing; --dry-run writes nothing.`

// Import runs `<prog> import`. It returns an exit code: 0 when everything
// was imported, 1 when something was skipped or conflicted (see the
// summary), 2 on bad flags.
func Import(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) int {
	name := prog + " import"
	fs := NewFlagSet(name, name+" (--from-table T | --from-query SQL | --from-stripe --period P)... [flags]", importHelp, stderr)
	var (
		dbURL, schema, redisURL, stream, namespace string
		cfg                                        importer.Config
		stripe                                     Stripe
		log                                        Logging
		jsonOut                                    bool
	)
	RegisterDatabase(fs, &dbURL)
	RegisterSchema(fs, &schema)
	RegisterRedis(fs, &redisURL)
	stripe.Register(fs)
	log.Register(fs)
	RegisterNamespace(fs, &namespace, "the idempotency-key namespace pelguard will run with")
	fs.StringVar(&cfg.FromTable, "from-table", "", "the team's billing table, schema-qualified (e.g. public.billing_records)")
	fs.StringVar(&cfg.FromQuery, "from-query", "", "a query returning the common columns by name (run READ ONLY)")
	fs.BoolVar(&cfg.FromStripe, "from-stripe", false, "also list --period's unmarked succeeded charges at Stripe")
	fs.StringVar(&cfg.Period, "period", "", "import only this billing period (YYYY-MM); required with --from-stripe")
	fs.StringVar(&cfg.Description, "description", importer.DefaultDescription, "the team's charge description; {period} is the billing period")
	fs.StringVar(&stream, "stream", "", "the billing stream whose events map Stripe customers to customer ids (optional)")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "show what would be imported; write nothing")
	fs.BoolVar(&jsonOut, "json", false, "print the summary as JSON")
	if err := Parse(fs, args); err != nil {
		return Fail(stderr, name, err)
	}
	if err := MonthPeriod("period", cfg.Period, "leave --period out to import every period"); err != nil {
		return Fail(stderr, name, err)
	}
	logger, err := log.Logger(stderr)
	if err != nil {
		return Fail(stderr, name, err)
	}
	RouteLibraryLogs(logger)
	sc, err := stripe.Client(logger, nil, Share{Role: stripelimit.RoleAudit}) // one-off: this process alone, at --stripe-fallback-rate
	if err != nil {
		return Fail(stderr, name, err)
	}
	pool, err := OpenDB(ctx, prog, dbURL, schema, 4)
	if err != nil {
		return Fail(stderr, name, err)
	}
	defer pool.Close()
	cfg.DB, cfg.Schema, cfg.Stripe, cfg.Namespace, cfg.Logger, cfg.Progress = pool, schema, sc, namespace, logger, stderr
	if err := importAgrees(ctx, pool, schema, stream, namespace); err != nil {
		return Fail(stderr, name, err)
	}
	if stream != "" {
		rdb, err := OpenRedis(ctx, redisURL)
		if err != nil {
			return Fail(stderr, name, err)
		}
		defer rdb.Close()
		if cfg.Events, err = streamEvents(ctx, rdb, stream, stderr); err != nil {
			return Fail(stderr, name, err)
		}
	}
	sum, err := importer.Run(ctx, cfg)
	if err != nil {
		return Fail(stderr, name, Usagef("%v", redact.Error(err)))
	}
	if jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(sum)
	} else {
		printImport(stdout, sum)
	}
	if len(sum.Skipped) > 0 || len(sum.Conflicts) > 0 {
		return ExitFindings
	}
	return ExitOK
}

// streamEvents reads every valid event on stream (XRANGE, 1,000 at a time);
// invalid entries are the consumer's to dead-letter, not the import's.
func streamEvents(ctx context.Context, rdb redis.UniversalClient, stream string, progress io.Writer) ([]event.Event, error) {
	var out []event.Event
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, stream, start, "+", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", stream, err)
		}
		for _, m := range msgs {
			if ev, err := event.ParseFields(m.Values, event.Rules{}); err == nil {
				out = append(out, ev)
			}
		}
		if len(msgs) < 1000 {
			fmt.Fprintf(progress, "import: read %d events from %s\n", len(out), stream)
			return out, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

func printImport(w io.Writer, s importer.Summary) {
	verb := "imported"
	if s.DryRun {
		verb = "would import"
	}
	fmt.Fprintf(w, "read %d rows of the team's table and %d unmarked charges at Stripe\n", s.TeamRows, s.StripeCharges)
	fmt.Fprintf(w, "%s %d charged and %d declined rows; %d already in the ledger\n", verb, s.ImportedCharged, s.ImportedDeclined, s.AlreadyInLedger)
	if s.Repaired > 0 {
		fmt.Fprintf(w, "repaired %d rows the ledger had as pending or processing: Stripe has their charge, now recorded charged\n", s.Repaired)
	}
	if len(s.Periods) > 0 {
		fmt.Fprintf(w, "periods with imported history (pelguard asks Stripe before charging in them): %s\n", strings.Join(s.Periods, ", "))
	}
	for _, d := range s.Duplicates {
		fmt.Fprintf(w, "duplicate: %s/%s charge %s (%s) besides canonical %s: a duplicate_charge finding; `pelguard-auditor refund` can refund it\n",
			d.CustomerID, d.BillingPeriod, d.ChargeID, alerts.Money(d.AmountCents, d.Currency), d.CanonicalChargeID)
	}
	for _, p := range s.Skipped {
		fmt.Fprintf(w, "skipped: %s/%s %s: %s\n", p.CustomerID, p.BillingPeriod, p.ChargeID, p.Reason)
	}
	for _, p := range s.Conflicts {
		fmt.Fprintf(w, "conflict: %s/%s %s: %s\n", p.CustomerID, p.BillingPeriod, p.ChargeID, p.Reason)
	}
}

// importAgrees refuses an import under another namespace than a charge
// stream records (--stream's, or any when none is given): the rows it
// writes would carry keys the fleet never computes, and each of their
// events would be dead-lettered conflicting_event.
func importAgrees(ctx context.Context, pool *pgxpool.Pool, schema, stream, namespace string) error {
	facts, err := streamfacts.List(ctx, pool, schema)
	if err != nil {
		return redact.Error(err)
	}
	for _, f := range facts {
		if f.Stream.Kind != streamfacts.Charges || (stream != "" && f.Stream.Name != stream) || f.Namespace == namespace {
			continue
		}
		return Usagef("%v", &streamfacts.MismatchError{Stream: f.Stream, Recorded: f.Namespace, Given: namespace,
			RecordedBy: f.RecordedBy, RecordedAt: f.RecordedAt})
	}
	return nil
}
