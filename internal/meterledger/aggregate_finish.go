package meterledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FinishAggregate records the outcome of an aggregate's call with its
// members, fenced by the holder's epoch, and frees the slot: Delivered
// (members delivered), Failed (members failed and their use taken back;
// parked instead after an attempt of unknown outcome), Park, or Release
// (stays sending, of unknown outcome, for a takeover). It returns what
// was recorded (0: the hold was lost).
func (l *Ledger) FinishAggregate(ctx context.Context, a Aggregate, res Result, reason string) (Result, error) {
	got, err := l.FinishAggregates(ctx, []AggregateOutcome{{Aggregate: a, Result: res, Reason: reason}})
	if err != nil {
		return 0, err
	}
	return got[0], nil
}

// AggregateOutcome is the outcome of a held aggregate's call.
type AggregateOutcome struct {
	Aggregate Aggregate
	Result    Result
	Reason    string
}

// FinishAggregates is FinishAggregate for many aggregates (a sender's
// round) in one transaction of a few statements; results are in outs'
// order.
func (l *Ledger) FinishAggregates(ctx context.Context, outs []AggregateOutcome) ([]Result, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	now := l.clock.Now().UTC().Truncate(time.Microsecond)
	n := len(outs)
	ids, sc, names := make([]string, n), make([]string, n), make([]string, n)
	epochs, toks := make([]int64, n), make([]int64, n)
	aggs := make([]Aggregate, n)
	for i, o := range outs {
		ids[i], epochs[i], toks[i] = o.Aggregate.hold()
		sc[i], names[i], aggs[i] = o.Aggregate.StripeCustomerID, o.Aggregate.EventName, o.Aggregate
	}
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight s USING unnest($1::text[], $2::text[], $3::bigint[]) AS u(sc, name, tok)
		WHERE s.stripe_customer_id = u.sc AND s.event_name = u.name AND s.token = u.tok AND s.token = ANY($3)`, sc, names, toks); err != nil {
		return nil, err
	}
	// The aggregates still held (sending at the holder's epoch), locked.
	rows, err := tx.Query(ctx, `SELECT a.identifier, a.outcome_unknown FROM {schema}.meter_aggregates a
		JOIN unnest($1::text[], $2::bigint[]) AS u(id, epoch) ON a.identifier = u.id AND a.epoch = u.epoch
		WHERE a.identifier = ANY($1) AND a.status = 'sending' ORDER BY a.identifier FOR UPDATE OF a`, ids, epochs)
	if err != nil {
		return nil, err
	}
	unknown := map[string]bool{}
	var id string
	var unk bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &unk}, func() error { unknown[id] = unk; return nil }); err != nil {
		return nil, err
	}
	results := make([]Result, n)
	var aggIDs, aggSt, aggReason []string
	var aggEpoch []int64
	var memIDs, memSt, memReason []string
	var memUnknown []bool
	var failed []string
	lo, hi := spanOf(aggs)
	for i, o := range outs {
		unk, held := unknown[ids[i]]
		if !held {
			continue // the hold was lost: 0
		}
		res, reason := o.Result, o.Reason
		if res == Failed && unk {
			res, reason = Park, ParkedAfterUnknown+": "+reason
		}
		results[i] = res
		st := resultStatus[res]
		aggIDs, aggEpoch, aggSt, aggReason = append(aggIDs, ids[i]), append(aggEpoch, epochs[i]), append(aggSt, st), append(aggReason, reason)
		if res == Release {
			continue
		}
		memIDs, memSt, memReason, memUnknown = append(memIDs, ids[i]), append(memSt, st), append(memReason, reason), append(memUnknown, unk)
		if res == Failed {
			failed = append(failed, ids[i])
		}
	}
	if len(aggIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_aggregates a SET status = u.st, lease_owner = NULL, lease_expires_at = NULL,
				delivered_at = CASE WHEN u.st = 'delivered' THEN $5::timestamptz END, last_error = nullif(u.reason, ''),
				outcome_unknown = a.outcome_unknown OR u.st = 'sending'
			FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS u(id, epoch, st, reason)
			WHERE a.identifier = u.id AND a.epoch = u.epoch AND a.identifier = ANY($1)`, aggIDs, aggEpoch, aggSt, aggReason, now); err != nil {
			return nil, err
		}
	}
	if len(memIDs) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_events m SET status = u.st,
				delivered_at = CASE WHEN u.st = 'delivered' THEN $5::timestamptz END,
				last_error = CASE WHEN u.st = 'delivered' THEN NULL ELSE u.reason END, outcome_unknown = m.outcome_unknown OR u.unknown
			FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[]) AS u(id, st, reason, unknown)
			WHERE m.aggregate = u.id AND m.aggregate = ANY($1) AND m.status = 'sending' AND m.event_ts >= $6 AND m.event_ts < $7`,
			memIDs, memSt, memReason, memUnknown, now, lo, hi); err != nil {
			return nil, err
		}
	}
	for _, id := range failed {
		if _, err := tx.Exec(ctx, uncountSQL(`(SELECT event_name, stripe_customer_id, event_ts, value FROM {schema}.meter_events
			WHERE aggregate = $2 AND status = 'failed') f`, "$1"), now, id); err != nil {
			return nil, err
		}
	}
	if len(memIDs) > 0 && l.witness != nil {
		var seq int64
		if err := tx.QueryRow(ctx, `INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at) VALUES ($1, 1, $2)
			ON CONFLICT (writer) DO UPDATE SET seq = w.seq + 1, updated_at = $2 RETURNING seq`, l.writer(), now).Scan(&seq); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		l.witness.Committed(seq)
		return results, nil
	}
	return results, tx.Commit(ctx)
}

// Members reads an aggregate's member rows.
func (l *Ledger) Members(ctx context.Context, identifier string) ([]Record, error) {
	return l.MembersOf(ctx, Aggregate{Identifier: identifier})
}

// MembersOf is Members of a, reading only the partitions a's members can
// be in (memberSpan).
func (l *Ledger) MembersOf(ctx context.Context, a Aggregate) ([]Record, error) {
	got, err := l.MembersOfAll(ctx, []Aggregate{a})
	return got[a.Identifier], err
}

// MembersOfAll is MembersOf of each of aggs in one read, by identifier.
func (l *Ledger) MembersOfAll(ctx context.Context, aggs []Aggregate) (map[string][]Record, error) {
	if len(aggs) == 0 {
		return nil, nil
	}
	ids := make([]string, len(aggs))
	for i, a := range aggs {
		ids[i] = a.Identifier
	}
	lo, hi := spanOf(aggs)
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+`, m.aggregate FROM {schema}.meter_events m WHERE m.aggregate = ANY($1)
		AND m.event_ts >= $2 AND m.event_ts < $3
		ORDER BY m.aggregate, m.event_ts, m.identifier`, ids, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("reading meter aggregate members: %w", err)
	}
	defer rows.Close()
	got := make(map[string][]Record, len(aggs))
	for rows.Next() {
		var agg string
		rec, _, err := scanRecord(rows, &agg)
		if err != nil {
			return nil, err
		}
		got[agg] = append(got[agg], rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading meter aggregate members: %w", err)
	}
	return got, nil
}

// spanOf bounds the timestamps of the members of every one of aggs
// (memberSpan of each; aggs not empty).
func spanOf(aggs []Aggregate) (lo, hi time.Time) {
	lo, hi = memberSpan(aggs[0])
	for _, a := range aggs[1:] {
		l, h := memberSpan(a)
		lo, hi = minTime(lo, l), maxTime(hi, h)
	}
	return lo, hi
}
