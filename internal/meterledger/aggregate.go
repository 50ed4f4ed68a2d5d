package meterledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Per-second aggregates of sum meters (DESIGN.md "Usage at volume"): one
// Stripe call carries the sum of a customer-meter's queued events whose
// timestamps share one second (ts.Unix()). Stripe keeps a meter event's
// timestamp in whole seconds, so its summaries see what per-event sends
// would have shown. A wider bucket (bucket.go: a width dividing an hour,
// to catch up a backlog in fewer calls) sends its members' sum at the
// bucket's start instead. The aggregate's identifier and members are written in
// one transaction before its first call and never recomputed: a re-send
// carries the same identifier and value, so Stripe refuses it as a
// duplicate if an earlier attempt got through; each event is a member of
// at most one aggregate; an event queued after its second's aggregate was
// formed joins a new one (other members, another identifier). Count and
// last meters are never aggregated: Stripe counts events, or keeps the
// last one of a second in an order the ledger cannot prove.

// Aggregate is one row of meter_aggregates.
type Aggregate struct {
	Identifier       string
	Stream           string
	EventName        string
	StripeCustomerID string
	// Second is the start of its bucket of event time, the timestamp it
	// is sent with: its members' second with the default width.
	Second time.Time
	// Bucket is the width it was formed with (DefaultBucket for
	// aggregates formed before widths were kept).
	Bucket time.Duration
	// ArrivalSecond is the arrival bucket of every member, aligned down
	// to Bucket (0: formed before buckets were kept); LateJoin: formed
	// after another aggregate of the same second, arrival and width
	// (FormAggregate).
	ArrivalSecond  int64
	LateJoin       bool
	Value          int64
	Members        int
	Digest         string
	Status         Status
	FirstSentAt    time.Time
	Attempts       int
	OutcomeUnknown bool
	Epoch          int64
	LeaseOwner     string
	LastError      string
	slotToken      int64
}

// AggregateIdentifier names the aggregate of members (their identifiers)
// of one customer-meter's second, and Digest hashes members with their
// values: both are saved before the first call, never recomputed.
func AggregateIdentifier(namespace, eventName, stripeCustomerID string, second time.Time, members []string) string {
	return aggregateIdentifier(namespace, eventName, stripeCustomerID, second, 0, members)
}

// aggregateIdentifier: late > 0 names the late-th late join of a bucket
// formed before (its members differ from the first's; late keeps two
// late joins of the same members, a replay of a refused aggregate, apart).
func aggregateIdentifier(namespace, eventName, stripeCustomerID string, second time.Time, late int64, members []string) string {
	ids := slices.Clone(members)
	slices.Sort(ids)
	head := []string{"pelguard-meter-aggregate-v1", namespace, eventName, stripeCustomerID, strconv.FormatInt(second.Unix(), 10)}
	if late > 0 {
		head = append(head, "late", strconv.FormatInt(late, 10))
	}
	h := sha256.New()
	for _, f := range append(head, ids...) {
		h.Write([]byte(strconv.Itoa(len(f)) + ":" + f))
	}
	return "pga_" + hex.EncodeToString(h.Sum(nil))[:48]
}

func digest(members []Record) string {
	type member struct {
		id    string
		value int64
	}
	s := make([]member, len(members)) // sorted, not the records: thousands of them in a busy second
	for i, m := range members {
		s[i] = member{m.Identifier, m.Value}
	}
	slices.SortFunc(s, func(a, b member) int { return compareStr(a.id, b.id) })
	h := sha256.New()
	for _, m := range s {
		h.Write([]byte(m.id + "=" + strconv.FormatInt(m.value, 10) + ";"))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Hold is what the holder of a sending aggregate presents to FinishAggregate.
func (a Aggregate) hold() (string, int64, int64) { return a.Identifier, a.Epoch, a.slotToken }

// takeSlot is takeSlots of one customer-meter: its new grant (0: busy).
func takeSlot(ctx context.Context, tx pgx.Tx, schema, sc, name, identifier string, second time.Time, owner string, exp, now time.Time) (int64, error) {
	k := MeterKey{EventName: name, StripeCustomerID: sc}
	got, err := takeSlots(ctx, tx, schema, []MeterKey{k}, identifier, second, owner, exp, now)
	return got[k], err
}

// The arrival bucket of a meter_events row m: b = max(a, s), a the second
// its stream entry was added (its entry_second; a row written before that
// column, its entry id's milliseconds / 1000; a row without an entry id,
// from before ingest kept it, takes s), s its timestamp's.
func bucketSQL(m string) string {
	sec := secondSQL(m)
	return `greatest(coalesce(` + m + `.entry_second, ` + entrySecondSQL(m+`.stream_message_id`) + `, ` + sec + `), ` + sec + `)`
}

// entrySecondSQL is the second a stream entry id (a text expression) was
// added: its milliseconds / 1000, NULL for NULL or an id of another form.
// Every statement that writes a row's stream_message_id writes its
// entry_second with it (entryValuesSQL, entrySetSQL), so entry_second,
// where set, is what bucketSQL would read from the id.
func entrySecondSQL(id string) string {
	return `CASE WHEN ` + id + ` ~ '^[0-9]{1,18}-[0-9]{1,19}$' THEN split_part(` + id + `, '-', 1)::bigint / 1000 END`
}

// entryValuesSQL is the values of (stream_message_id, entry_second) for
// an insert of entry id id.
func entryValuesSQL(id string) string { return id + `, ` + entrySecondSQL(id) }

// entrySetSQL sets a row's stream_message_id to id in an update, and its
// entry_second with it.
func entrySetSQL(id string) string {
	return `stream_message_id = ` + id + `, entry_second = ` + entrySecondSQL(id)
}

// memberSpan bounds the timestamps of a's members: within a day of its
// second (every member's timestamp is in its bucket), so a statement on
// them plans and reads two or three daily partitions, not all of them.
// Unbounded when a's second is not known.
func memberSpan(a Aggregate) (lo, hi time.Time) {
	if a.Second.IsZero() {
		return time.Time{}, time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return a.Second.Add(-24 * time.Hour), a.Second.Add(24 * time.Hour)
}

func secondSQL(m string) string { return `floor(extract(epoch FROM ` + m + `.event_ts))::bigint` }

// UnformAggregate undoes a formed aggregate that was never sent (an
// operator's pause came between its formation and its call): it is
// deleted, its members are queued again and the slot is freed, fenced by
// the holder's epoch and slot. Its members are fixed by the stream, so
// the aggregate formed again later is the same one, under the same
// identifier (the witness of this one, if a rollback brings it back, names
// the same call). A taken-over aggregate (attempted before) is not undone:
// false.
func (l *Ledger) UnformAggregate(ctx context.Context, a Aggregate) (bool, error) {
	id, epoch, tok := a.hold()
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_aggregates WHERE identifier = $1 AND epoch = $2 AND status = 'sending'
		AND attempts = 1 AND NOT outcome_unknown`, id, epoch)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	lo, hi := memberSpan(a)
	if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_events SET status = 'queued', aggregate = NULL
		WHERE aggregate = $1 AND status = 'sending' AND event_ts >= $2 AND event_ts < $3`, id, lo, hi); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight WHERE stripe_customer_id = $1 AND event_name = $2 AND token = $3`,
		a.StripeCustomerID, a.EventName, tok); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

var aggCols = `a.identifier, a.stream, a.event_name, a.stripe_customer_id, a.second, a.value, a.members, a.digest, a.status,
	a.first_sent_at, a.attempts, a.outcome_unknown, a.epoch, coalesce(a.lease_owner, ''), coalesce(a.last_error, ''),
	coalesce(a.arrival_second, 0), a.bucket_seconds`

func scanAggregate(r pgx.Row) (Aggregate, error) {
	var a Aggregate
	var st string
	var w int64
	err := r.Scan(&a.Identifier, &a.Stream, &a.EventName, &a.StripeCustomerID, &a.Second, &a.Value, &a.Members, &a.Digest, &st,
		&a.FirstSentAt, &a.Attempts, &a.OutcomeUnknown, &a.Epoch, &a.LeaseOwner, &a.LastError, &a.ArrivalSecond, &w)
	a.Status, a.Second, a.FirstSentAt, a.Bucket = Status(st), a.Second.UTC(), a.FirstSentAt.UTC(), time.Duration(w)*time.Second
	return a, err
}

// StaleAggregates lists up to limit of stream's aggregates left sending by
// a holder that is gone (no lease, or an expired one) whose customer-meter
// slot is free: unknown outcomes to take over (TakeOverAggregate).
func (l *Ledger) StaleAggregates(ctx context.Context, stream string, limit int) ([]Aggregate, error) {
	now := l.clock.Now().UTC()
	rows, err := l.pool.Query(ctx, `SELECT `+aggCols+` FROM {schema}.meter_aggregates a
		LEFT JOIN {schema}.meter_inflight s ON s.stripe_customer_id = a.stripe_customer_id AND s.event_name = a.event_name
		WHERE a.status = 'sending' AND a.stream = $1 AND (a.lease_expires_at IS NULL OR a.lease_expires_at <= $2)
			AND (s.token IS NULL OR s.expires_at <= $2)
		ORDER BY a.first_sent_at LIMIT $3`, stream, now, limit)
	if err != nil {
		return nil, fmt.Errorf("listing stale meter aggregates: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Aggregate, error) { return scanAggregate(r) })
}

// TakeOverAggregate takes over a stale aggregate: within the safe window of
// its first attempt it is the caller's (a new epoch, the lease and the
// slot: TakenOver), to be re-sent with the same identifier and value; past
// it, it is parked with its members (Parked), never re-sent. Busy: someone
// else took it, or the slot is held.
func (l *Ledger) TakeOverAggregate(ctx context.Context, stale Aggregate, owner string, lease time.Duration) (Decision, Aggregate, string, error) {
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return 0, stale, "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if now.Sub(stale.FirstSentAt) >= l.safe || !stripeTakes(stale.Second, now) {
		reason := fmt.Sprintf("aggregate %s of %d events (sum %d) of unknown outcome older than Stripe's identifier window: not re-sent "+
			"(first attempt %s, %s ago)", stale.Identifier, stale.Members, stale.Value, stale.FirstSentAt.Format(time.RFC3339),
			now.Sub(stale.FirstSentAt).Round(time.Minute))
		tag, err := tx.Exec(ctx, `UPDATE {schema}.meter_aggregates SET status = 'parked', lease_owner = NULL, lease_expires_at = NULL,
			last_error = $3, outcome_unknown = true WHERE identifier = $1 AND epoch = $2 AND status = 'sending'`, stale.Identifier, stale.Epoch, reason)
		if err != nil || tag.RowsAffected() == 0 {
			return Busy, stale, "", err
		}
		lo, hi := memberSpan(stale)
		if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_events SET status = 'parked', outcome_unknown = true, last_error = $2
			WHERE aggregate = $1 AND status = 'sending' AND event_ts >= $3 AND event_ts < $4`, stale.Identifier, reason, lo, hi); err != nil {
			return 0, stale, "", err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight WHERE identifier = $1 AND expires_at <= $2`, stale.Identifier, now); err != nil {
			return 0, stale, "", err
		}
		stale.Status, stale.LastError = StatusParked, reason
		return Parked, stale, reason, tx.Commit(ctx)
	}
	tok, err := takeSlot(ctx, tx, l.pool.Schema(), stale.StripeCustomerID, stale.EventName, stale.Identifier, stale.Second, owner, now.Add(lease), now)
	if err != nil || tok == 0 {
		return Busy, stale, "", err
	}
	a, err := scanAggregate(tx.QueryRow(ctx, `UPDATE {schema}.meter_aggregates a SET epoch = `+strings.ReplaceAll(nextEpoch, "m.epoch", "a.epoch")+`, attempts = a.attempts + 1,
			outcome_unknown = true, lease_owner = $3, lease_expires_at = $4
		WHERE a.identifier = $1 AND a.epoch = $2 AND a.status = 'sending' AND (a.lease_expires_at IS NULL OR a.lease_expires_at <= $5)
		RETURNING `+aggCols, stale.Identifier, stale.Epoch, owner, now.Add(lease), now))
	if errors.Is(err, pgx.ErrNoRows) {
		return Busy, stale, "", nil
	}
	if err != nil {
		return 0, stale, "", err
	}
	a.slotToken = tok
	return TakenOver, a, "", tx.Commit(ctx)
}

func stripeTakes(ts, now time.Time) bool { return now.Sub(ts) < 35*24*time.Hour }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
