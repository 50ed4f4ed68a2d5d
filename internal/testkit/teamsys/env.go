package teamsys

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

//go:embed billing_records.sql
var billingRecordsDDL string

// CreateTable creates schema (if missing) and the team's billing_records in
// it. The schema is a separate one because pelguard's own ledger table has
// the same name.
func CreateTable(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		return errors.New("teamsys: CreateTable needs a schema")
	}
	// Identifiers cannot be bind parameters; Sanitize quotes the name.
	ident := pgx.Identifier{schema}.Sanitize()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("teamsys: creating billing_records in %s: %w", schema, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stmt := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + ident,
		"SET LOCAL search_path TO " + ident,
		billingRecordsDDL,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("teamsys: creating billing_records in %s: %w", schema, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("teamsys: creating billing_records in %s: %w", schema, err)
	}
	return nil
}

// SchemaURL adds options=-csearch_path=schema to a postgres:// URL. Both
// libpq (psycopg2) and pgx honour it, where a bare search_path= parameter
// works only for pgx: libpq rejects unknown URI parameters.
func SchemaURL(databaseURL, schema string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("teamsys: parsing the database URL: %w", err)
	}
	q := u.Query()
	q.Set("options", "-csearch_path="+schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// CreateGroup creates the consumer group at the stream's start (creating the
// stream if need be), as the team does once by hand: the article's code
// never creates it. An existing group is left alone.
func CreateGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("teamsys: XGROUP CREATE %s %s: %w", stream, group, err)
	}
	return nil
}

// Publish appends ev to stream as the team's producer and pelguard's
// consumer expect: one field "payload" with the event's JSON.
func Publish(ctx context.Context, rdb redis.UniversalClient, stream string, ev event.Event) (string, error) {
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: stream,
		Values: map[string]any{event.PayloadField: ev.Payload()},
	}).Result()
	if err != nil {
		return "", fmt.Errorf("teamsys: XADD %s: %w", stream, err)
	}
	return id, nil
}

// Row is one row of the team's billing_records. NULL reads as "" or 0.
type Row struct {
	CustomerID    string
	BillingPeriod string
	ChargeID      string // "" for a declined card
	AmountCents   int64
	Status        string // "charged" or "card_declined"
	Error         string // str(CardError) for a decline
	CreatedAt     time.Time
}

// ReadRows returns billing_records from the pool's search_path, ordered by
// customer and period.
func ReadRows(ctx context.Context, pool *pgxpool.Pool) ([]Row, error) {
	rows, err := pool.Query(ctx, `
		SELECT customer_id, billing_period, COALESCE(charge_id, ''), COALESCE(amount_cents, 0),
		       status, COALESCE(error, ''), created_at
		FROM billing_records ORDER BY customer_id, billing_period`)
	if err != nil {
		return nil, fmt.Errorf("teamsys: reading billing_records: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		err := r.Scan(&x.CustomerID, &x.BillingPeriod, &x.ChargeID, &x.AmountCents, &x.Status, &x.Error, &x.CreatedAt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("teamsys: reading billing_records: %w", err)
	}
	return out, nil
}

// Charges returns the emulator's succeeded, not fully refunded charges for a
// Stripe customer and billing period, oldest first. The team's charges carry
// no metadata, so the period is read from the article's description, "Usage
// billing for <period>"; a charge with billing_period metadata (pelguard's)
// counts too. More than one is a double charge.
func Charges(sim *stripesim.Server, stripeCustomerID, period string) []stripesim.Charge {
	var out []stripesim.Charge
	for _, ch := range sim.Charges() {
		if ch.Customer != stripeCustomerID || ch.Status != "succeeded" || ch.AmountRefunded >= ch.Amount {
			continue
		}
		if ch.Description == stripesim.DescriptionPrefix+period || ch.Metadata["billing_period"] == period {
			out = append(out, ch)
		}
	}
	return out
}

// Env is one test's world for the team's system: a stream and consumer group
// of its own on REDIS_URL, a fresh Postgres schema holding the team's
// billing_records, and a Stripe emulator. Everything goes away when the test
// ends.
type Env struct {
	Redis  *redis.Client
	Stream string
	Group  string
	// DB's search_path is Schema; DatabaseURL selects the same schema for
	// the team's processes (and for pgx).
	DB          *pgxpool.Pool
	DatabaseURL string
	Schema      string
	Sim         *stripesim.Server
}

// Setup checks Require and builds an Env. Its emulator follows wall time
// (Sim.Advance jumps it) and injects no faults until the test sets some.
func Setup(t testing.TB) *Env {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := &Env{
		Redis:  testenv.Redis(t),
		Stream: testenv.Name(t, "team-billing-stream"),
		Group:  testenv.Name(t, "team-billing-group"),
		Schema: "team_" + testenv.Suffix(),
	}
	testenv.CleanupKeys(t, e.Redis, e.Stream)
	if err := CreateGroup(ctx, e.Redis, e.Stream, e.Group); err != nil {
		t.Fatal(err)
	}

	admin, err := pg.Open(ctx, testenv.DatabaseURL(), 2)
	if err != nil {
		t.Fatalf("teamsys: Postgres is not reachable (run the tests with `make test`, which starts one): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.Schema}.Sanitize()+" CASCADE")
		admin.Close()
	})
	if err := CreateTable(ctx, admin, e.Schema); err != nil {
		t.Fatal(err)
	}
	if e.DatabaseURL, err = SchemaURL(testenv.DatabaseURL(), e.Schema); err != nil {
		t.Fatal(err)
	}
	if e.DB, err = pg.Open(ctx, e.DatabaseURL, 4); err != nil {
		t.Fatalf("teamsys: %v", err)
	}
	t.Cleanup(e.DB.Close)

	if e.Sim, err = stripesim.New(stripesim.Config{Logger: testenv.Logger(t)}); err != nil {
		t.Fatalf("teamsys: %v", err)
	}
	t.Cleanup(e.Sim.Close)
	return e
}

// Start starts a process of the team's system on this Env: cfg's connection
// fields, stream and group default to the Env's.
func (e *Env) Start(t testing.TB, cfg Config) *Proc {
	t.Helper()
	if cfg.RedisURL == "" {
		cfg.RedisURL = testenv.RedisURL()
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = e.DatabaseURL
	}
	if cfg.StripeURL == "" {
		cfg.StripeURL = e.Sim.URL()
	}
	if cfg.Stream == "" {
		cfg.Stream = e.Stream
	}
	if cfg.Group == "" {
		cfg.Group = e.Group
	}
	return Start(t, cfg)
}

// Publish appends ev to the Env's stream and returns its entry id.
func (e *Env) Publish(t testing.TB, ev event.Event) string {
	t.Helper()
	id, err := Publish(context.Background(), e.Redis, e.Stream, ev)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Rows returns the team's billing_records.
func (e *Env) Rows(t testing.TB) []Row {
	t.Helper()
	rows, err := ReadRows(context.Background(), e.DB)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// Pending is the group's PEL size (XPENDING's count).
func (e *Env) Pending(t testing.TB) int64 {
	t.Helper()
	p, err := e.Redis.XPending(context.Background(), e.Stream, e.Group).Result()
	if err != nil {
		t.Fatalf("teamsys: XPENDING %s %s: %v", e.Stream, e.Group, err)
	}
	return p.Count
}

// Charges is Charges on the Env's emulator.
func (e *Env) Charges(stripeCustomerID, period string) []stripesim.Charge {
	return Charges(e.Sim, stripeCustomerID, period)
}
