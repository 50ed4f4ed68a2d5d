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
	s := slices.Clone(members)
	slices.SortFunc(s, func(a, b Record) int { return compareStr(a.Identifier, b.Identifier) })
	h := sha256.New()
	for _, m := range s {
		h.Write([]byte(m.Identifier + "=" + strconv.FormatInt(m.Value, 10) + ";"))
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

// takeSlot takes the customer-meter's slot for identifier in tx when it
// is free or expired, returning its new grant (0: busy).
//
// A transaction of another sender taking the same slot (two consumers
// listed the same customer-meter) makes this one busy at once, not after
// waiting for that one to commit: the slot's transaction-scoped advisory
// lock, tried first, is held by it (a hash collision with another
// customer-meter is a rare busy, tried again next round).
func takeSlot(ctx context.Context, tx pgx.Tx, schema, sc, name, identifier string, second time.Time, owner string, exp, now time.Time) (int64, error) {
	tok := newToken()
	var got int64
	err := tx.QueryRow(ctx, `INSERT INTO {schema}.meter_inflight AS s (stripe_customer_id, event_name, identifier, event_ts, owner, expires_at, token)
		SELECT $1::text, $2::text, $3::text, $4::timestamptz, $5::text, $6::timestamptz, $7::bigint
		WHERE pg_try_advisory_xact_lock(hashtextextended('pelguard.meter_slot.' || $9::text || '.' || $1::text || '.' || $2::text, 0))
		ON CONFLICT (stripe_customer_id, event_name) DO UPDATE SET identifier = EXCLUDED.identifier, event_ts = EXCLUDED.event_ts,
			owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
			WHERE s.expires_at <= $8
		RETURNING token`, sc, name, identifier, second, owner, exp, tok, now, schema).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return got, err
}

// The arrival bucket of a meter_events row m: b = max(a, s), a the second
// its stream entry was added (its entry id's milliseconds / 1000; a row
// without one, from before ingest kept it, takes s), s its timestamp's.
func bucketSQL(m string) string {
	sec := secondSQL(m)
	return `greatest(coalesce(CASE WHEN ` + m + `.stream_message_id ~ '^[0-9]{1,18}-[0-9]{1,19}$'
		THEN split_part(` + m + `.stream_message_id, '-', 1)::bigint / 1000 END, ` + sec + `), ` + sec + `)`
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

// FormAggregate makes, in one transaction, an aggregate of stream's queued
// events of (stripeCustomerID, eventName), with the customer-meter's slot:
// its members move to sending under it. The members are every queued
// event with one key (timestamp second s, arrival bucket b = max(a, s),
// a the second its entry was added), for the key of the oldest queued
// event whose bucket ended at or before watermark, the group's ingest
// watermark (internal/watermark): every entry below it was acked after its
// row committed, so the bucket's members are all in the ledger and fixed
// by the stream; the same entries re-delivered after a rollback of both
// stores form the same aggregate under the same identifier. ok is false
// when the slot is taken or no bucket is ready.
//
// width (0: DefaultBucket; else CheckBucket's) widens both halves of the
// key alike: the members' seconds share one bucket [t, t+width) and their
// arrival buckets b one bucket [B, B+width), t and B aligned down to the
// width from the epoch; it is formed once the watermark passed B+width
// (every entry of a second below it acked, so every member is in the
// ledger; a later arrival falls in a later B) and sent with timestamp t.
// Each event belongs to one aggregate whatever the width of the runs that
// meet it: only queued events join one, and one formed is saved with its
// members and its width and never recomputed. The identifier hashes t and
// the members, not the width (the same members at the same t are the same
// call); the late-join count is per width.
//
// A bucket formed before (a late join: a row queued after its bucket was
// formed, though its entry was below the watermark then: a replay that
// kept its entry, a restore, a Redis clock that stepped back) is formed
// again as another aggregate of its late members (LateJoin; another
// identifier): each counted once.
func (l *Ledger) FormAggregate(ctx context.Context, namespace, stream, eventName, stripeCustomerID string, watermark time.Time,
	width time.Duration, owner string, lease time.Duration) (a Aggregate, members []Record, ok bool, err error) {
	return l.FormAggregateFrom(ctx, time.Time{}, namespace, stream, eventName, stripeCustomerID, watermark, width, owner, lease)
}

// FormAggregateFrom is FormAggregate for buckets of events no older than
// from's day (a sender's candidate, meterledger.Candidates): only the
// partitions from that day on are planned and read. An older event is
// formed by a later call from its own day. (A bucket never spans two days:
// its width divides an hour.)
func (l *Ledger) FormAggregateFrom(ctx context.Context, from time.Time, namespace, stream, eventName, stripeCustomerID string,
	watermark time.Time, width time.Duration, owner string, lease time.Duration) (a Aggregate, members []Record, ok bool, err error) {
	floor := from.UTC().Truncate(24 * time.Hour) // partitions are days
	w, err := bucketSeconds(width)
	if err != nil {
		return a, nil, false, err
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	// Arrival buckets [B, B+w) with B+w <= the watermark's second, that is
	// every b < ready, have ended at or before the watermark.
	ready := alignDown(watermark.Unix(), w)
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return a, nil, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tok, err := takeSlot(ctx, tx, l.pool.Schema(), stripeCustomerID, eventName, "pga_forming", now, owner, now.Add(lease), now)
	if err != nil || tok == 0 {
		return a, nil, false, err
	}
	var sec, bucket int64
	err = tx.QueryRow(ctx, `SELECT `+secondSQL("m")+`, `+bucketSQL("m")+` FROM {schema}.meter_events m
		WHERE m.stream = $1 AND m.stripe_customer_id = $2 AND m.event_name = $3 AND m.status = 'queued'
			AND m.event_ts < to_timestamp($4::bigint) AND `+bucketSQL("m")+` < $4::bigint AND m.event_ts >= $5
		ORDER BY m.stripe_customer_id, m.event_name, m.event_ts LIMIT 1`, stream, stripeCustomerID, eventName, ready, floor).Scan(&sec, &bucket)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, nil, false, nil
	}
	if err != nil {
		return a, nil, false, fmt.Errorf("finding a meter aggregate to form: %w", err)
	}
	second, bucket := time.Unix(alignDown(sec, w), 0).UTC(), alignDown(bucket, w)
	rows, err := tx.Query(ctx, `SELECT `+recordCols+` FROM {schema}.meter_events m
		WHERE m.stream = $1 AND m.stripe_customer_id = $2 AND m.event_name = $3 AND m.status = 'queued'
			AND m.event_ts >= $4 AND m.event_ts < $5 AND `+bucketSQL("m")+` >= $6::bigint AND `+bucketSQL("m")+` < $7::bigint
		ORDER BY m.event_ts, m.identifier FOR UPDATE OF m`, stream, stripeCustomerID, eventName, second, second.Add(time.Duration(w)*time.Second),
		bucket, bucket+w)
	if err != nil {
		return a, nil, false, err
	}
	members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Record, error) {
		rec, _, err := scanRecord(r)
		return rec, err
	})
	if err != nil || len(members) == 0 {
		return a, nil, false, err
	}
	var earlier int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM {schema}.meter_aggregates WHERE stream = $1 AND stripe_customer_id = $2
		AND event_name = $3 AND second = $4 AND arrival_second = $5 AND bucket_seconds = $6`, stream, stripeCustomerID, eventName, second, bucket,
		w).Scan(&earlier); err != nil {
		return a, nil, false, err
	}
	ids := make([]string, len(members))
	var sum int64
	var unknown bool
	firstSent := now
	for i, m := range members {
		ids[i], sum = m.Identifier, sum+m.Value
		if m.OutcomeUnknown {
			// Queued again by a repair: it may have been sent in an
			// aggregate the rollback lost (with its witness), which had
			// these same members (fixed by the stream). Formed of unknown
			// outcome since its ingest, and left to a takeover: re-sent
			// under the same identifier within the safe window, parked
			// with its members past it — never sent on its own.
			unknown = true
			if !m.FirstSentAt.IsZero() {
				firstSent = minTime(firstSent, m.FirstSentAt)
			}
		}
	}
	// The same members formed before, in another bucket: a replay of an
	// aggregate Stripe refused (its members reopened under the replay's
	// entries). The next late number names it; the probe finds the same
	// one again for the same ledger, so a re-formation is still the same.
	ident := aggregateIdentifier(namespace, eventName, stripeCustomerID, second, earlier, ids)
	for {
		var taken bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.meter_aggregates WHERE identifier = $1)`, ident).Scan(&taken); err != nil {
			return a, nil, false, err
		}
		if !taken {
			break
		}
		earlier++
		ident = aggregateIdentifier(namespace, eventName, stripeCustomerID, second, earlier, ids)
	}
	a = Aggregate{Identifier: ident, Stream: stream,
		EventName: eventName, StripeCustomerID: stripeCustomerID, Second: second, Bucket: time.Duration(w) * time.Second,
		ArrivalSecond: bucket, LateJoin: earlier > 0,
		Value: sum, Members: len(members), Digest: digest(members), Status: StatusSending, FirstSentAt: now, Attempts: 1,
		LeaseOwner: owner, slotToken: tok}
	holder, exp := &owner, new(time.Time)
	*exp = now.Add(lease)
	if unknown {
		holder, exp, a.FirstSentAt, a.OutcomeUnknown, a.LeaseOwner = nil, nil, firstSent, true, ""
	}
	if err := tx.QueryRow(ctx, `INSERT INTO {schema}.meter_aggregates (identifier, stream, event_name, stripe_customer_id, second, value,
			members, digest, status, first_sent_at, epoch, lease_owner, lease_expires_at, created_at, arrival_second, outcome_unknown,
			bucket_seconds)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'sending', $9, `+firstEpoch+`, $10, $11, $13, $12, $14, $15) RETURNING epoch`,
		a.Identifier, stream, eventName, stripeCustomerID, second, sum, len(members), a.Digest, a.FirstSentAt, holder, exp, bucket,
		now, unknown, w).Scan(&a.Epoch); err != nil {
		return a, nil, false, fmt.Errorf("recording meter aggregate: %w", err)
	}
	ts, mids := make([]time.Time, len(members)), make([]string, len(members))
	for i, m := range members {
		ts[i], mids[i] = m.EventTS, m.Identifier
	}
	// Members are sending with no lease of their own: the aggregate's
	// lease and epoch fence them (FinishAggregate writes them with it).
	if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_events m SET status = 'sending', aggregate = $1,
			first_sent_at = CASE WHEN m.outcome_unknown THEN m.first_sent_at ELSE $2 END
		FROM unnest($3::timestamptz[], $4::text[]) AS u(ts, id)
		WHERE m.event_ts = u.ts AND m.identifier = u.id AND m.event_ts = ANY($3)`, a.Identifier, now, ts, mids); err != nil {
		return a, nil, false, fmt.Errorf("recording meter aggregate members: %w", err)
	}
	if unknown {
		// No call now: the slot is freed and the next round's takeover
		// (StaleAggregates) decides it.
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight WHERE token = $1`, tok); err != nil {
			return a, nil, false, err
		}
		return a, members, false, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_inflight SET identifier = $1, event_ts = $2 WHERE token = $3`,
		a.Identifier, second, tok); err != nil {
		return a, nil, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return a, nil, false, err
	}
	return a, members, true, nil
}

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

// Members reads an aggregate's member rows.
func (l *Ledger) Members(ctx context.Context, identifier string) ([]Record, error) {
	return l.MembersOf(ctx, Aggregate{Identifier: identifier})
}

// MembersOf is Members of a, reading only the partitions a's members can
// be in (memberSpan).
func (l *Ledger) MembersOf(ctx context.Context, a Aggregate) ([]Record, error) {
	lo, hi := memberSpan(a)
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.meter_events m WHERE m.aggregate = $1
		AND m.event_ts >= $2 AND m.event_ts < $3
		ORDER BY m.event_ts, m.identifier`, a.Identifier, lo, hi)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Record, error) {
		rec, _, err := scanRecord(r)
		return rec, err
	})
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

// FinishAggregate records the outcome of an aggregate's call with its
// members, fenced by the holder's epoch, and frees the slot: Delivered
// (members delivered), Failed (members failed and their use taken back;
// parked instead after an attempt of unknown outcome), Park, or Release
// (stays sending, of unknown outcome, for a takeover). It returns what
// was recorded (0: the hold was lost).
func (l *Ledger) FinishAggregate(ctx context.Context, a Aggregate, res Result, reason string) (Result, error) {
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	id, epoch, tok := a.hold()
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight WHERE stripe_customer_id = $1 AND event_name = $2 AND token = $3`,
		a.StripeCustomerID, a.EventName, tok); err != nil {
		return 0, err
	}
	st := resultStatus[res]
	var unknown bool
	err = tx.QueryRow(ctx, `SELECT outcome_unknown FROM {schema}.meter_aggregates WHERE identifier = $1 AND epoch = $2 AND status = 'sending' FOR UPDATE`,
		id, epoch).Scan(&unknown)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, tx.Commit(ctx)
	}
	if err != nil {
		return 0, err
	}
	if res == Failed && unknown {
		res, st, reason = Park, string(StatusParked), ParkedAfterUnknown+": "+reason
	}
	if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_aggregates SET status = $3, lease_owner = NULL, lease_expires_at = NULL,
			delivered_at = CASE WHEN $3 = 'delivered' THEN $4::timestamptz END, last_error = nullif($5, ''),
			outcome_unknown = outcome_unknown OR $3 = 'sending'
		WHERE identifier = $1 AND epoch = $2`, id, epoch, st, now, reason); err != nil {
		return 0, err
	}
	if res != Release {
		lo, hi := memberSpan(a)
		rows, err := tx.Query(ctx, `UPDATE {schema}.meter_events SET status = $2,
				delivered_at = CASE WHEN $2 = 'delivered' THEN $3::timestamptz END,
				last_error = CASE WHEN $2 = 'delivered' THEN NULL ELSE $4 END, outcome_unknown = outcome_unknown OR $5
			WHERE aggregate = $1 AND status = 'sending' AND event_ts >= $6 AND event_ts < $7
			RETURNING event_name, stripe_customer_id, event_ts, value`, id, st, now, reason, unknown, lo, hi)
		if err != nil {
			return 0, err
		}
		rows.Close()
		if res == Failed {
			if _, err := tx.Exec(ctx, uncountSQL(`(SELECT event_name, stripe_customer_id, event_ts, value FROM {schema}.meter_events
				WHERE aggregate = $2 AND status = 'failed') f`, "$1"), now, id); err != nil {
				return 0, err
			}
		}
	}
	if res != Release && l.witness != nil {
		var seq int64
		if err := tx.QueryRow(ctx, `INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at) VALUES ($1, 1, $2)
			ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $2 RETURNING seq`, l.writer(), now).Scan(&seq); err != nil {
			return 0, err
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		l.witness.Committed(seq)
		return res, nil
	}
	return res, tx.Commit(ctx)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
