package meterledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

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
	formed, err := l.FormAggregates(ctx, FormRequest{Namespace: namespace, Stream: stream, From: from,
		Watermark: watermark, Width: width, Owner: owner, Lease: lease},
		[]MeterKey{{EventName: eventName, StripeCustomerID: stripeCustomerID}})
	if err != nil || len(formed) == 0 {
		return a, nil, false, err
	}
	f := formed[0]
	return f.Aggregate, f.Members, f.Send, nil
}

// MeterKey is a customer-meter: Stripe takes one of its events at a time.
type MeterKey struct{ EventName, StripeCustomerID string }

// FormRequest is what FormAggregates forms with, for every key alike.
type FormRequest struct {
	Namespace, Stream string
	// From: only events from its day on are read (zero: every day).
	From      time.Time
	Watermark time.Time
	Width     time.Duration
	Owner     string
	Lease     time.Duration
}

// Formed is one aggregate FormAggregates made. Send is false for one
// formed of unknown outcome (its members were queued again by a repair):
// not to be sent now; a takeover (StaleAggregates) decides it.
type Formed struct {
	Aggregate Aggregate
	// Members as they were queued: keys, values, entries and outcome
	// flags, not their fields (MembersOf reads whole rows).
	Members []Record
	Send    bool
	// More: its customer-meter has another bucket ready to form.
	More bool
}

// FormAggregates is FormAggregate for many customer-meters in one
// transaction of a few statements, whatever their number (a sender's
// round): each key whose slot is free and that has a ready bucket gets
// its next aggregate, the others nothing. Formed are in keys' order.
func (l *Ledger) FormAggregates(ctx context.Context, fr FormRequest, keys []MeterKey) ([]Formed, error) {
	w, err := bucketSeconds(fr.Width)
	if err != nil {
		return nil, err
	}
	keys = uniqueKeys(keys)
	if len(keys) == 0 {
		return nil, nil
	}
	floor := fr.From.UTC().Truncate(24 * time.Hour) // partitions are days
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	// Arrival buckets [B, B+w) with B+w <= the watermark's second, that is
	// every b < ready, have ended at or before the watermark.
	ready := alignDown(fr.Watermark.Unix(), w)
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	toks, err := takeSlots(ctx, tx, l.pool.Schema(), keys, "pga_forming", now, fr.Owner, now.Add(fr.Lease), now)
	if err != nil || len(toks) == 0 {
		return nil, err
	}
	held := make([]MeterKey, 0, len(toks))
	for _, k := range keys {
		if toks[k] != 0 {
			held = append(held, k)
		}
	}
	fs, err := l.readyBuckets(ctx, tx, fr.Stream, held, ready, floor, w)
	if err != nil || len(fs) == 0 {
		return nil, err
	}
	if err := l.readMembers(ctx, tx, fr.Stream, fs, w); err != nil {
		return nil, err
	}
	if l.membersRead != nil {
		l.membersRead()
	}
	if err := l.nameAggregates(ctx, tx, fr, fs, w, now); err != nil {
		return nil, err
	}
	var out []Formed
	for _, f := range fs {
		if len(f.Members) == 0 {
			continue
		}
		f.Aggregate.slotToken = toks[MeterKey{f.Aggregate.EventName, f.Aggregate.StripeCustomerID}]
		out = append(out, *f)
	}
	if err := l.saveAggregates(ctx, tx, fr, out, w, now); errors.Is(err, errMembersMoved) {
		return nil, nil // formed again from their rows as they are now, next round
	} else if err != nil {
		return nil, err
	}
	if err := l.readyAgain(ctx, tx, fr.Stream, out, ready, floor); err != nil {
		return nil, err
	}
	// The slots of keys with nothing formed, and of aggregates of unknown
	// outcome (no call now: the next round's takeover decides them), are
	// freed; the others name their aggregate.
	var freed, named []int64
	var ids []string
	var secs []time.Time
	formedKeys := map[MeterKey]bool{}
	for _, f := range out {
		k := MeterKey{f.Aggregate.EventName, f.Aggregate.StripeCustomerID}
		formedKeys[k] = true
		if !f.Send {
			freed = append(freed, toks[k])
			continue
		}
		named, ids, secs = append(named, toks[k]), append(ids, f.Aggregate.Identifier), append(secs, f.Aggregate.Second)
	}
	for _, k := range held {
		if !formedKeys[k] {
			freed = append(freed, toks[k])
		}
	}
	if len(freed) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight WHERE token = ANY($1)`, freed); err != nil {
			return nil, err
		}
	}
	if len(named) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_inflight s SET identifier = u.id, event_ts = u.ts
			FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS u(tok, id, ts) WHERE s.token = u.tok`, named, ids, secs); err != nil {
			return nil, err
		}
	}
	return out, tx.Commit(ctx)
}

func uniqueKeys(keys []MeterKey) []MeterKey {
	seen := make(map[MeterKey]bool, len(keys))
	var out []MeterKey
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// takeSlots takes, in tx, the slot of each of keys that is free or
// expired, for identifier, returning the new grants of those it took.
//
// A transaction of another sender taking the same slot (two consumers
// listed the same customer-meter) makes this one busy at once, not after
// waiting for that one to commit: the slot's transaction-scoped advisory
// lock, tried first, is held by it (a hash collision with another
// customer-meter is a rare busy, tried again next round). A slot held
// and not expired, as this transaction sees it, is busy without touching
// its row: ON CONFLICT DO UPDATE locks the row it finds even where its
// WHERE refuses it, so the holder's finish (which deletes it) waited for
// this whole transaction, and this one for the holder's finish (at
// volume, 34 s of lock waits a minute between two consumers).
func takeSlots(ctx context.Context, tx pgx.Tx, schema string, keys []MeterKey, identifier string, second time.Time, owner string,
	exp, now time.Time) (map[MeterKey]int64, error) {
	sc, names, toks := make([]string, len(keys)), make([]string, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		sc[i], names[i], toks[i] = k.StripeCustomerID, k.EventName, newToken()
	}
	rows, err := tx.Query(ctx, `INSERT INTO {schema}.meter_inflight AS s (stripe_customer_id, event_name, identifier, event_ts, owner, expires_at, token)
		SELECT k.sc, k.name, $4::text, $5::timestamptz, $6::text, $7::timestamptz, k.tok
		FROM unnest($1::text[], $2::text[], $3::bigint[]) AS k(sc, name, tok)
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.meter_inflight h WHERE h.stripe_customer_id = k.sc AND h.event_name = k.name
				AND h.expires_at > $8)
			AND pg_try_advisory_xact_lock(hashtextextended('pelguard.meter_slot.' || $9::text || '.' || k.sc || '.' || k.name, 0))
		ON CONFLICT (stripe_customer_id, event_name) DO UPDATE SET identifier = EXCLUDED.identifier, event_ts = EXCLUDED.event_ts,
			owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, token = EXCLUDED.token
			WHERE s.expires_at <= $8
		RETURNING s.stripe_customer_id, s.event_name, s.token`, sc, names, toks, identifier, second, owner, exp, now, schema)
	if err != nil {
		return nil, err
	}
	got := map[MeterKey]int64{}
	var k MeterKey
	var tok int64
	_, err = pgx.ForEachRow(rows, []any{&k.StripeCustomerID, &k.EventName, &tok}, func() error {
		got[k] = tok
		return nil
	})
	return got, err
}

// readyBuckets finds, for each of keys, the key of its oldest queued event
// whose arrival bucket ended before ready (a second), from floor on.
func (l *Ledger) readyBuckets(ctx context.Context, tx pgx.Tx, stream string, keys []MeterKey, ready int64, floor time.Time,
	w int64) ([]*Formed, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	sc, names := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		sc[i], names[i] = k.StripeCustomerID, k.EventName
	}
	rows, err := tx.Query(ctx, `SELECT k.i, b.sec, b.bucket FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS k(k_sc, k_name, i)
		CROSS JOIN LATERAL (SELECT `+secondSQL("m")+` AS sec, `+bucketSQL("m")+` AS bucket FROM {schema}.meter_events m
			WHERE m.stream = $1 AND m.stripe_customer_id = k.k_sc AND m.event_name = k.k_name AND m.status = 'queued'
				AND m.event_ts < to_timestamp($4::bigint) AND `+bucketSQL("m")+` < $4::bigint AND m.event_ts >= $5
			ORDER BY m.stripe_customer_id, m.event_name, m.event_ts LIMIT 1) b
		ORDER BY k.i`, stream, sc, names, ready, floor)
	if err != nil {
		return nil, fmt.Errorf("finding meter aggregates to form: %w", err)
	}
	var fs []*Formed
	var i, sec, bucket int64
	_, err = pgx.ForEachRow(rows, []any{&i, &sec, &bucket}, func() error {
		k := keys[i-1]
		fs = append(fs, &Formed{Aggregate: Aggregate{Stream: stream, EventName: k.EventName, StripeCustomerID: k.StripeCustomerID,
			Second: time.Unix(alignDown(sec, w), 0).UTC(), Bucket: time.Duration(w) * time.Second, ArrivalSecond: alignDown(bucket, w)}})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("finding meter aggregates to form: %w", err)
	}
	return fs, nil
}

// readMembers reads the queued members of each of fs's buckets: what an
// aggregate is made of (key, value, entry, outcome), not their fields (a
// busy customer's second is thousands of rows). They are not locked here
// (that would write each row once more): the slot keeps other senders off
// them, and saveAggregates moves them by the same predicate only if what
// it moves is what was read (errMembersMoved otherwise).
func (l *Ledger) readMembers(ctx context.Context, tx pgx.Tx, stream string, fs []*Formed, w int64) error {
	sc, names, secs, buckets := bucketColumns(fs)
	lo, hi := secs[0], secs[0]
	for _, s := range secs {
		lo, hi = minTime(lo, s), maxTime(hi, s)
	}
	span := time.Duration(w) * time.Second
	// The outer bounds let the plan read only the partitions of the
	// buckets' days.
	rows, err := tx.Query(ctx, `SELECT m.event_ts, m.identifier, m.event_name, m.stripe_customer_id, coalesce(m.customer_id, ''), m.value,
			m.first_sent_at, m.outcome_unknown, coalesce(m.stream_message_id, ''), m.created_at, coalesce(m.stream, ''), k.i,
			count(*) OVER (PARTITION BY k.i) FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::bigint[])
			WITH ORDINALITY AS k(k_sc, k_name, k_sec, k_bucket, i)
		CROSS JOIN LATERAL (SELECT * FROM {schema}.meter_events m
			WHERE m.stream = $1 AND m.stripe_customer_id = k.k_sc AND m.event_name = k.k_name AND m.status = 'queued'
				AND m.event_ts >= k.k_sec AND m.event_ts < k.k_sec + make_interval(secs => $6)
				AND m.event_ts >= $7 AND m.event_ts < $8
				AND `+bucketSQL("m")+` >= k.k_bucket AND `+bucketSQL("m")+` < k.k_bucket + $6::bigint) m
		ORDER BY k.i, m.event_ts, m.identifier`, stream, sc, names, secs, buckets, w, lo, hi.Add(span))
	if err != nil {
		return fmt.Errorf("reading meter aggregate members: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i, n int64
		r := Record{Status: StatusQueued}
		if err := rows.Scan(&r.EventTS, &r.Identifier, &r.EventName, &r.StripeCustomerID, &r.CustomerID, &r.Value, &r.FirstSentAt,
			&r.OutcomeUnknown, &r.StreamMessageID, &r.CreatedAt, &r.Stream, &i, &n); err != nil {
			return err
		}
		r.EventTS, r.FirstSentAt, r.CreatedAt = r.EventTS.UTC(), r.FirstSentAt.UTC(), r.CreatedAt.UTC()
		f := fs[i-1]
		if f.Members == nil {
			// Sized once: a busy second is thousands of large records,
			// and growing them copied each several times.
			f.Members = make([]Record, 0, n)
		}
		f.Members = append(f.Members, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading meter aggregate members: %w", err)
	}
	return nil
}

// readyAgain sets More on each of out whose customer-meter has a queued
// event of a ready bucket of a later second: a hint to send it again
// first, not a promise (a later arrival bucket of the same second is left
// to the next listing). Its search starts past the formed bucket: the
// members just moved out of the queued index are still in it, invisible,
// and a busy customer's second is thousands of them to step over.
func (l *Ledger) readyAgain(ctx context.Context, tx pgx.Tx, stream string, out []Formed, ready int64, floor time.Time) error {
	if len(out) == 0 {
		return nil
	}
	sc, names := make([]string, len(out)), make([]string, len(out))
	next := make([]time.Time, len(out))
	for i, f := range out {
		a := f.Aggregate
		sc[i], names[i], next[i] = a.StripeCustomerID, a.EventName, a.Second.Add(a.Bucket)
	}
	// Ordered by the whole key, as readyBuckets: a semi-join planned on
	// stale statistics read every queued row of the stream per round. The
	// floor ($6) is a constant bound for the plan's partitions.
	rows, err := tx.Query(ctx, `SELECT k.i FROM unnest($2::text[], $3::text[], $5::timestamptz[]) WITH ORDINALITY AS k(k_sc, k_name, k_next, i)
		CROSS JOIN LATERAL (SELECT 1 FROM {schema}.meter_events m
			WHERE m.stream = $1 AND m.stripe_customer_id = k.k_sc AND m.event_name = k.k_name AND m.status = 'queued'
				AND m.event_ts < to_timestamp($4::bigint) AND `+bucketSQL("m")+` < $4::bigint AND m.event_ts >= k.k_next
				AND m.event_ts >= $6
			ORDER BY m.stripe_customer_id, m.event_name, m.event_ts LIMIT 1) q`,
		stream, sc, names, ready, next, floor)
	if err != nil {
		return err
	}
	var i int64
	_, err = pgx.ForEachRow(rows, []any{&i}, func() error { out[i-1].More = true; return nil })
	return err
}

// bucketColumns is each of fs's key (customer, meter, second, arrival
// bucket) as columns, for unnest.
func bucketColumns(fs []*Formed) (sc, names []string, secs []time.Time, buckets []int64) {
	for _, f := range fs {
		a := f.Aggregate
		sc, names = append(sc, a.StripeCustomerID), append(names, a.EventName)
		secs, buckets = append(secs, a.Second), append(buckets, a.ArrivalSecond)
	}
	return sc, names, secs, buckets
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// nameAggregates sums each of fs's members and names it: the identifier
// of its members at its second, numbered after the aggregates formed
// before of the same bucket (a late join).
func (l *Ledger) nameAggregates(ctx context.Context, tx pgx.Tx, fr FormRequest, fs []*Formed, w int64, now time.Time) error {
	sc, names, secs, buckets := bucketColumns(fs)
	earlier := make([]int64, len(fs))
	rows, err := tx.Query(ctx, `SELECT (SELECT count(*) FROM {schema}.meter_aggregates a WHERE a.stream = $1 AND a.stripe_customer_id = k.k_sc
			AND a.event_name = k.k_name AND a.second = k.k_sec AND a.arrival_second = k.k_bucket AND a.bucket_seconds = $6)
		FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::bigint[]) WITH ORDINALITY AS k(k_sc, k_name, k_sec, k_bucket, i)
		ORDER BY k.i`, fr.Stream, sc, names, secs, buckets, w)
	if err != nil {
		return err
	}
	var n int64
	i := 0
	if _, err := pgx.ForEachRow(rows, []any{&n}, func() error { earlier[i], i = n, i+1; return nil }); err != nil {
		return err
	}
	memberIDs := make([][]string, len(fs))
	for i, f := range fs {
		a := &f.Aggregate
		ids := make([]string, len(f.Members))
		var sum int64
		var unknown bool
		firstSent := now
		for j, m := range f.Members {
			ids[j], sum = m.Identifier, sum+m.Value
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
		memberIDs[i] = ids
		a.Value, a.Members, a.Digest, a.Status, a.FirstSentAt, a.Attempts, a.LeaseOwner = sum, len(f.Members), digest(f.Members),
			StatusSending, now, 1, fr.Owner
		if unknown {
			a.FirstSentAt, a.OutcomeUnknown, a.LeaseOwner = firstSent, true, ""
		}
		f.Send = !unknown
	}
	// The same members formed before, in another bucket: a replay of an
	// aggregate Stripe refused (its members reopened under the replay's
	// entries). The next late number names it; the probe finds the same
	// one again for the same ledger, so a re-formation is still the same.
	probe := make([]int, 0, len(fs))
	for i, f := range fs {
		if len(f.Members) > 0 {
			probe = append(probe, i)
		}
	}
	for len(probe) > 0 {
		ids := make([]string, len(probe))
		for j, i := range probe {
			a := &fs[i].Aggregate
			a.Identifier = aggregateIdentifier(fr.Namespace, a.EventName, a.StripeCustomerID, a.Second, earlier[i], memberIDs[i])
			ids[j] = a.Identifier
		}
		rows, err := tx.Query(ctx, `SELECT identifier FROM {schema}.meter_aggregates WHERE identifier = ANY($1)`, ids)
		if err != nil {
			return err
		}
		taken, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		again := probe[:0]
		for _, i := range probe {
			if slices.Contains(taken, fs[i].Aggregate.Identifier) {
				earlier[i]++
				again = append(again, i)
			}
		}
		probe = again
	}
	for i, f := range fs {
		f.Aggregate.LateJoin = earlier[i] > 0
	}
	return nil
}

// memberKey is a member's row under the aggregate it was read for.
type memberKey struct {
	agg string
	ts  int64
	id  string
}

// errMembersMoved: what saveAggregates moved is not what readMembers read
// (a repair or a replay wrote a member meanwhile, or a late event was
// queued into the bucket); the round's transaction is rolled back and
// nothing formed.
var errMembersMoved = errors.New("meter aggregate members changed while it was formed")

// saveAggregates records out's aggregates and moves their members to
// sending under them, only if what is queued in their buckets is what was
// read.
func (l *Ledger) saveAggregates(ctx context.Context, tx pgx.Tx, fr FormRequest, out []Formed, w int64, now time.Time) error {
	if len(out) == 0 {
		return nil
	}
	n := len(out)
	ids, names, sc, digests := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	secs, firsts := make([]time.Time, n), make([]time.Time, n)
	values, counts, buckets, widths := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	unknown := make([]bool, n)
	members := 0
	lo, hi := out[0].Aggregate.Second, out[0].Aggregate.Second
	for i, f := range out {
		a := f.Aggregate
		ids[i], names[i], sc[i], digests[i] = a.Identifier, a.EventName, a.StripeCustomerID, a.Digest
		secs[i], firsts[i], values[i], counts[i] = a.Second, a.FirstSentAt, a.Value, int64(a.Members)
		buckets[i], widths[i], unknown[i] = a.ArrivalSecond, int64(a.Bucket/time.Second), a.OutcomeUnknown
		members += len(f.Members)
		lo, hi = minTime(lo, a.Second), maxTime(hi, a.Second)
	}
	rows, err := tx.Query(ctx, `INSERT INTO {schema}.meter_aggregates (identifier, stream, event_name, stripe_customer_id, second, value,
			members, digest, status, first_sent_at, epoch, lease_owner, lease_expires_at, created_at, arrival_second, outcome_unknown,
			bucket_seconds)
		SELECT u.id, $1, u.name, u.sc, u.sec, u.val, u.n, u.dig, 'sending', u.first, `+firstEpoch+`,
			CASE WHEN u.unknown THEN NULL ELSE $12::text END, CASE WHEN u.unknown THEN NULL ELSE $13::timestamptz END, $14, u.bucket,
			u.unknown, u.w
		FROM unnest($2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::bigint[], $7::int[], $8::text[], $9::timestamptz[],
			$10::bigint[], $11::bool[], $15::int[]) AS u(id, name, sc, sec, val, n, dig, first, bucket, unknown, w)
		RETURNING identifier, epoch`, fr.Stream, ids, names, sc, secs, values, counts, digests, firsts, buckets, unknown,
		fr.Owner, now.Add(fr.Lease), now, widths)
	if err != nil {
		return fmt.Errorf("recording meter aggregates: %w", err)
	}
	epochs := map[string]int64{}
	var id string
	var epoch int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &epoch}, func() error { epochs[id] = epoch; return nil }); err != nil {
		return fmt.Errorf("recording meter aggregates: %w", err)
	}
	for i := range out {
		out[i].Aggregate.Epoch = epochs[out[i].Aggregate.Identifier]
	}
	// Members are sending with no lease of their own: the aggregate's
	// lease and epoch fence them (FinishAggregate writes them with it).
	// They are moved by the predicate they were read by (one range of the
	// queued index per bucket; naming each of a busy second's thousands of
	// keys cost the move a lookup per key), and what moved must be what was
	// read: the same keys, values and outcome flags, none more (a late
	// event queued meanwhile) and none fewer (a repair or a replay wrote
	// one).
	rows, err = tx.Query(ctx, `UPDATE {schema}.meter_events m SET status = 'sending', aggregate = u.agg,
			first_sent_at = CASE WHEN m.outcome_unknown THEN m.first_sent_at ELSE $1 END
		FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::bigint[], $6::text[]) AS u(sc, name, sec, bucket, agg)
		WHERE m.stream = $7 AND m.stripe_customer_id = u.sc AND m.event_name = u.name AND m.status = 'queued'
			AND m.event_ts >= u.sec AND m.event_ts < u.sec + make_interval(secs => $8)
			AND m.event_ts >= $9 AND m.event_ts < $10
			AND `+bucketSQL("m")+` >= u.bucket AND `+bucketSQL("m")+` < u.bucket + $8::bigint
		RETURNING m.aggregate, m.event_ts, m.identifier, m.value, m.outcome_unknown, m.first_sent_at`,
		now, sc, names, secs, buckets, ids, fr.Stream, w, lo, hi.Add(time.Duration(w)*time.Second))
	if err != nil {
		return fmt.Errorf("recording meter aggregate members: %w", err)
	}
	read := make(map[memberKey]Record, members)
	for _, f := range out {
		for _, m := range f.Members {
			read[memberKey{f.Aggregate.Identifier, m.EventTS.UnixMicro(), m.Identifier}] = m
		}
	}
	var (
		mk    memberKey
		ts    time.Time
		r     Record
		moved = 0
		same  = true
	)
	if _, err := pgx.ForEachRow(rows, []any{&mk.agg, &ts, &mk.id, &r.Value, &r.OutcomeUnknown, &r.FirstSentAt}, func() error {
		mk.ts, moved = ts.UnixMicro(), moved+1
		m, ok := read[mk]
		same = same && ok && m.Value == r.Value && m.OutcomeUnknown == r.OutcomeUnknown && (!r.OutcomeUnknown || m.FirstSentAt.Equal(r.FirstSentAt))
		return nil
	}); err != nil {
		return fmt.Errorf("recording meter aggregate members: %w", err)
	}
	if !same || moved != members {
		return errMembersMoved
	}
	return nil
}
