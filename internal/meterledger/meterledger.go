// Package meterledger is the only code that reads or writes meter_events and
// meter_inflight (migration 00014), meter_usage and meter_caps (00019,
// caps.go): the ledger of usage events sent to
// Stripe Billing Meters, so that each is counted by Stripe at most once
// (DESIGN.md invariant 12) whatever Redis redelivers.
//
// Stripe refuses a repeated identifier only within a rolling window of at
// least 24 hours, and there is no API to look an event up. So the ledger
// decides every send: an event recorded as delivered is never sent again,
// at any age; an event of unknown outcome (a timeout, a crash between
// Stripe's 200 and the ledger write) is re-sent under the same identifier
// only within the safe window (23 h) of its first attempt, and parked for a
// person past it. Stripe allows one concurrent call per customer per meter:
// meter_inflight holds one slot per (customer, meter) for the whole fleet.
//
// The work is batched for a consumer reading many entries at once: Reserve
// reads a batch's rows and slots in one statement and writes its decisions
// in a second (each statement is its own transaction), Finish and
// ExtendMany are one statement each. Every write after Reserve is fenced by
// the row's epoch (above the ledger's epoch floor, ledger.EpochFloorSQL) and
// the slot's token.
package meterledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/clock"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
	"github.com/pelguard/pelguard/stripeapi"
)

// DefaultSafeWindow is how long after its first attempt an event of unknown
// outcome may be sent again: below Stripe's identifier window
// (stripeapi.MeterIdentifierWindow, at least 24 h) by an hour of margin for
// clock drift and the time a call takes.
const DefaultSafeWindow = 23 * time.Hour

// Status is a meter event's state.
type Status string

// The states of a meter event.
const (
	// StatusQueued: recorded at ingest (its use counted, its entry acked),
	// not sent yet: known not to be at Stripe. A sender moves it to sending.
	StatusQueued Status = "queued"
	// StatusSending: reserved; sent or about to be, outcome not recorded.
	StatusSending Status = "sending"
	// StatusDelivered: Stripe accepted it (or refused its identifier as a
	// duplicate: an earlier attempt reached Stripe). Never sent again.
	StatusDelivered Status = "delivered"
	// StatusParked: not sent again by the ledger, outcome unknown or not
	// attempted (past the safe window, past Stripe's 35 days): a person
	// looks (last_error says why).
	StatusParked Status = "parked"
	// StatusFailed: Stripe refused it for good (unknown meter, bad value).
	StatusFailed Status = "failed"
)

// Key identifies a meter event's row: its timestamp (to the millisecond,
// UTC) and its identifier.
type Key struct {
	EventTS    time.Time
	Identifier string
}

// KeyOf is the key of ev sent under identifier.
func KeyOf(ev event.MeterEvent, identifier string) Key {
	return Key{EventTS: ev.Timestamp.UTC().Truncate(time.Millisecond), Identifier: identifier}
}

func (k Key) String() string { return k.Identifier + "@" + k.EventTS.Format(time.RFC3339Nano) }

// Record is one row of meter_events.
type Record struct {
	Key
	EventName        string
	StripeCustomerID string
	CustomerID       string
	Value            int64
	Status           Status
	FirstSentAt      time.Time
	Attempts         int
	Epoch            int64
	LeaseOwner       string
	LeaseExpiresAt   time.Time // zero when no lease is held
	DeliveredAt      time.Time
	LastError        string
	StreamMessageID  string
	CreatedAt        time.Time
	// OutcomeUnknown: an attempt ended without knowing whether Stripe
	// counted the event (a lost reply, a timeout, a crash): the event is
	// never recorded failed after it, and counts as possibly at Stripe
	// until a person settles it (SettledAt).
	OutcomeUnknown bool
	SettledAt      time.Time
	// ReplayOverride: the operator's word (who, when, why) that reopened
	// the event past the safe window of its first attempt.
	ReplayOverride string
	// Stream and Fields: the stream the event was ingested from and its
	// entry's fields (JSON), so a refusal is dead-lettered from the
	// ledger's copy after the entry was acked. Empty for per-event rows.
	Stream string
	Fields string
}

// MaybeCounted reports whether Stripe may have counted the event though
// the ledger does not record it delivered: parked, or failed after an
// attempt of unknown outcome, and not settled by a person.
func (r Record) MaybeCounted() bool {
	return r.SettledAt.IsZero() && (r.Status == StatusParked || r.Status == StatusFailed && r.OutcomeUnknown)
}

// LeftToAPerson reports whether the event waits on a person: of unknown
// outcome (MaybeCounted: to check at Stripe and settle), or settled as not
// counted (to replay). A consumer that reads its entry again dead-letters
// it, so that they can.
func (r Record) LeftToAPerson() bool {
	return r.MaybeCounted() || r.Status == StatusFailed && !r.SettledAt.IsZero()
}

// LeaseLive reports whether someone holds an unexpired lease at now.
func (r Record) LeaseLive(now time.Time) bool {
	return r.Status == StatusSending && r.LeaseOwner != "" && r.LeaseExpiresAt.After(now)
}

// ErrNotFound: no such row.
var ErrNotFound = errors.New("no meter event")

// Config configures a Ledger.
type Config struct {
	// Schema holds the tables (empty: pg.DefaultSchema).
	Schema string
	// Clock measures leases and windows; nil means the wall clock.
	Clock clock.Clock
	// SafeWindow: an event of unknown outcome is re-sent only this long
	// after its first attempt. Default DefaultSafeWindow; it must stay
	// below stripeapi.MeterIdentifierWindow.
	SafeWindow time.Duration
}

// Validate reports a configuration that cannot keep invariant 12.
func (c Config) Validate() error {
	if c.SafeWindow < 0 || c.SafeWindow >= stripeapi.MeterIdentifierWindow {
		return fmt.Errorf("meter ledger: SafeWindow %s must be positive and below Stripe's identifier window (%s)",
			c.SafeWindow, stripeapi.MeterIdentifierWindow)
	}
	if c.Schema != "" {
		return pg.ValidSchema(c.Schema)
	}
	return nil
}

// Ledger reads and writes meter events.
type Ledger struct {
	pool    pg.DB
	clock   clock.Clock
	safe    time.Duration
	witness ledger.Witness
	// membersRead, in tests, runs between reading an aggregate's members
	// and saving it (export_test.go).
	membersRead func()

	mu sync.Mutex
	// ensured is the range of days this process knows partitions exist for.
	ensuredFrom, ensuredTo time.Time
}

// New returns a Ledger over pool.
func New(pool *pgxpool.Pool, cfg Config) (*Ledger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{pool: pg.NewDB(pool, cfg.Schema), clock: clock.Or(cfg.Clock),
		safe: cmp.Or(cfg.SafeWindow, DefaultSafeWindow)}, nil
}

// SetWitness makes the writes whose effect leaves Postgres (a finish or a
// park, which an XACK follows) bump w's row in ledger_witness, as
// ledger.Ledger's do. Call it before the ledger is used.
func (l *Ledger) SetWitness(w ledger.Witness) { l.witness = w }

// SafeWindow is the configured safe window.
func (l *Ledger) SafeWindow() time.Duration { return l.safe }

func (l *Ledger) writer() string {
	if l.witness == nil {
		return ""
	}
	return l.witness.Writer()
}

// cols is a row of meter_events aliased a, readable when the row is
// missing (a LEFT JOIN): scanRecord reports found = false then.
func cols(a string) string {
	return a + `.event_ts, coalesce(` + a + `.identifier, ''), coalesce(` + a + `.event_name, ''),
	coalesce(` + a + `.stripe_customer_id, ''), coalesce(` + a + `.customer_id, ''), coalesce(` + a + `.value, 0),
	coalesce(` + a + `.status, ''), ` + a + `.first_sent_at, coalesce(` + a + `.attempts, 0), coalesce(` + a + `.epoch, 0),
	coalesce(` + a + `.lease_owner, ''), ` + a + `.lease_expires_at, ` + a + `.delivered_at,
	coalesce(` + a + `.last_error, ''), coalesce(` + a + `.stream_message_id, ''), ` + a + `.created_at,
	coalesce(` + a + `.outcome_unknown, false), ` + a + `.settled_at, coalesce(` + a + `.replay_override, ''),
	coalesce(` + a + `.stream, ''), coalesce(` + a + `.fields::text, '')`
}

var recordCols = cols("m")

func scanRecord(row pgx.Row, extra ...any) (Record, bool, error) {
	var r Record
	var status string
	var ts, first, exp, delivered, created, settled *time.Time
	dest := append([]any{&ts, &r.Identifier, &r.EventName, &r.StripeCustomerID, &r.CustomerID, &r.Value,
		&status, &first, &r.Attempts, &r.Epoch, &r.LeaseOwner, &exp, &delivered,
		&r.LastError, &r.StreamMessageID, &created, &r.OutcomeUnknown, &settled, &r.ReplayOverride,
		&r.Stream, &r.Fields}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Record{}, false, err
	}
	r.Status = Status(status)
	r.EventTS, r.FirstSentAt, r.LeaseExpiresAt = utc(ts), utc(first), utc(exp)
	r.DeliveredAt, r.CreatedAt, r.SettledAt = utc(delivered), utc(created), utc(settled)
	return r, ts != nil, nil
}

func utc(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// Get reads one row.
func (l *Ledger) Get(ctx context.Context, k Key) (Record, error) {
	r, _, err := scanRecord(l.pool.QueryRow(ctx, `SELECT `+recordCols+` FROM {schema}.meter_events m
		WHERE m.event_ts = $1 AND m.identifier = $2`, k.EventTS, k.Identifier))
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%s: %w", k, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("reading meter event %s: %w", k, err)
	}
	return r, nil
}

// Lookup reads many rows in one query (the reaper's page), in the order of
// keys; found[i] is false where keys[i] has no row.
func (l *Ledger) Lookup(ctx context.Context, keys []Key) (recs []Record, found []bool, err error) {
	recs, found = make([]Record, len(keys)), make([]bool, len(keys))
	if len(keys) == 0 {
		return recs, found, nil
	}
	ts, ids := make([]time.Time, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ts[i], ids[i] = k.EventTS, k.Identifier
	}
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+`, r.i
		FROM unnest($1::timestamptz[], $2::text[]) WITH ORDINALITY AS r(ts, id, i)
		JOIN {schema}.meter_events m ON m.event_ts = r.ts AND m.identifier = r.id AND m.event_ts = ANY($1)`, ts, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("looking up %d meter events: %w", len(keys), err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		r, _, err := scanRecord(rows, &i)
		if err != nil {
			return nil, nil, fmt.Errorf("scanning meter event: %w", err)
		}
		recs[i-1], found[i-1] = r, true
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("looking up %d meter events: %w", len(keys), err)
	}
	return recs, found, nil
}

// Counts returns the number of rows per status among events of [from, to).
func (l *Ledger) Counts(ctx context.Context, from, to time.Time) (map[Status]int64, error) {
	rows, err := l.pool.Query(ctx, `SELECT status, count(*) FROM {schema}.meter_events
		WHERE event_ts >= $1 AND event_ts < $2 GROUP BY status`, from, to)
	if err != nil {
		return nil, fmt.Errorf("counting meter events: %w", err)
	}
	out := map[Status]int64{}
	var status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		out[Status(status)] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting meter events: %w", err)
	}
	return out, nil
}

// CustomerTotal is one Stripe customer's delivered usage of a meter.
type CustomerTotal struct {
	StripeCustomerID string
	Value            int64 // the sum of the delivered events' values
	Events           int64
}

// DeliveredTotals sums the delivered events of eventName whose timestamps
// fall in [from, to), per Stripe customer (ordered by it), in Postgres: what
// Stripe's event summaries of the meter should show, for reconciliation.
func (l *Ledger) DeliveredTotals(ctx context.Context, eventName string, from, to time.Time) ([]CustomerTotal, error) {
	rows, err := l.pool.Query(ctx, `SELECT stripe_customer_id, sum(value)::bigint, count(*) FROM {schema}.meter_events
		WHERE status = 'delivered' AND event_name = $1 AND event_ts >= $2 AND event_ts < $3
		GROUP BY stripe_customer_id ORDER BY stripe_customer_id`, eventName, from, to)
	if err != nil {
		return nil, fmt.Errorf("summing delivered %s events: %w", eventName, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CustomerTotal])
	if err != nil {
		return nil, fmt.Errorf("summing delivered %s events: %w", eventName, err)
	}
	return out, nil
}
