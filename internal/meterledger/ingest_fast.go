package meterledger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The ingest's one-statement path. Every commit waits for its WAL flush,
// and a transaction holds the row locks it took until that flush is done;
// the exact path (ingestLocked) locks the batch's meter_usage rows first,
// so every batch that holds an event of one busy customer queued behind
// the previous one's flush. This path takes those locks last, just before
// the commit, in one statement and one round trip:
//
//  1. it reads (without locking) each meter's use and cap, and leaves out
//     the events of every customer-meter whose batch could pass its cap
//     even if all were new (for sum meters, the positive values only);
//  2. inserts the other events queued, ON CONFLICT DO NOTHING (an event
//     already in the ledger, or inserted meanwhile by another consumer,
//     is not written);
//  3. adds what it inserted to meter_usage, rows locked in one order, on
//     the latest committed count;
//  4. checks each cap against that count and, should one be passed (a
//     concurrent ingest used the headroom read in 1), fails the statement:
//     nothing of it is written, and the batch goes the exact path.
//
// Only inserted events are counted, and only when all of a customer-meter's
// events fit, which is when the exact path would count them all too. The
// events left out, replays (a failed or parked row reopened), and batches
// whose statement failed go the exact path; an event that was already in
// the ledger is decided from its row, as there.

// ingestFast records reqs, by the one-statement path where it can and
// ingestLocked for the rest; out[i] answers reqs[i].
func (l *Ledger) ingestFast(ctx context.Context, reqs []IngestRequest, now time.Time) ([]Ingested, error) {
	if slices.ContainsFunc(reqs, func(r IngestRequest) bool { return r.Replay }) {
		return l.ingestLocked(ctx, reqs, now)
	}
	items := make([]*ingestItem, len(reqs))
	// The first copy of an event decides for the batch's others, as in
	// the exact path.
	first := map[Key]*ingestItem{}
	var firsts, cands []*ingestItem
	for i, r := range reqs {
		it := &ingestItem{i: i, req: r, key: KeyOf(r.Event, r.Identifier)}
		items[i] = it
		if _, dup := first[it.key]; dup {
			continue
		}
		first[it.key] = it
		firsts = append(firsts, it)
		if d, _ := decideRow(now, l.safe, r.Request, it.key, nil); d == Acquired {
			cands = append(cands, it)
		}
	}
	inserted, leftOut, err := l.insertQueued(ctx, cands, now)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == capPassedCode {
		return l.ingestLocked(ctx, reqs, now) // a cap's headroom was used meanwhile
	}
	if err != nil {
		return nil, err
	}
	// The exact path takes the events of the customer-meters left out,
	// with their copies.
	var slow []IngestRequest
	var slowAt []int
	for _, it := range items {
		if leftOut[first[it.key]] {
			slow, slowAt = append(slow, it.req), append(slowAt, it.i)
		}
	}
	// Decide the rest from their rows, as the exact path does: an event
	// found in the ledger is never written or counted again.
	var read []*ingestItem
	for _, it := range firsts {
		if _, ok := inserted[it]; !ok && !leftOut[it] {
			read = append(read, it)
		}
	}
	if len(read) > 0 {
		if err := readRows(ctx, l.pool, read); err != nil {
			return nil, err
		}
	}
	var adopt []*ingestItem
	for _, it := range read {
		d, reason := decideRow(now, l.safe, it.req.Request, it.key, it.row)
		it.out = Ingested{Decision: d, Reason: reason}
		if it.row != nil {
			it.out.Record = *it.row
		}
		switch d {
		case Acquired, TakenOver, Busy, Parked, SlotBusy:
			// Queued or sending: a sender has it, or finishes it.
			it.out.Decision, it.out.Reason = InLedger, ""
		}
		if it.row == nil && d == Acquired {
			// A candidate the insert did not write, whose row is gone
			// again (a partition dropped meanwhile): decide it again.
			return nil, &pgconn.PgError{Code: "40001", Message: "meter event " + it.key.String() + " was neither written nor found"}
		}
		if it.out.Decision == InLedger && it.row.Stream == "" {
			adopt = append(adopt, it)
		}
	}
	if err := l.adopt(ctx, adopt); err != nil {
		return nil, err
	}
	out := make([]Ingested, len(items))
	for _, it := range items {
		f := first[it.key]
		switch {
		case leftOut[f]:
			continue
		case f != it && (inserted[f] != 0 || f.row != nil):
			out[it.i] = Ingested{Decision: InLedger, Reason: "another copy of the event in this batch"}
		case f != it:
			out[it.i] = f.out // both refused alike
		case inserted[it] != 0:
			out[it.i] = Ingested{Decision: Queued, Record: queuedRecord(it, inserted[it], now)}
		default:
			out[it.i] = it.out
		}
	}
	if len(slow) > 0 {
		got, err := l.ingestLocked(ctx, slow, now)
		if err != nil {
			return nil, err
		}
		for j, g := range got {
			out[slowAt[j]] = g
		}
	}
	return out, nil
}

// capPassedCode is the SQLSTATE insertQueuedSQL fails with when a cap
// would be passed (division_by_zero, raised on purpose: see step 4).
const capPassedCode = "22012"

func queuedRecord(it *ingestItem, epoch int64, now time.Time) Record {
	ev := it.req.Event
	return Record{Key: it.key, EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID, CustomerID: ev.CustomerID,
		Value: ev.Value, Status: StatusQueued, FirstSentAt: now, Attempts: 1, Epoch: epoch, StreamMessageID: it.req.MessageID,
		CreatedAt: now, Stream: it.req.Stream, Fields: string(it.fields)}
}

// insertQueued runs insertQueuedSQL for cands: it returns the epoch of each
// inserted, and the candidates of the customer-meters it left out.
func (l *Ledger) insertQueued(ctx context.Context, cands []*ingestItem, now time.Time) (map[*ingestItem]int64, map[*ingestItem]bool, error) {
	inserted, leftOut := map[*ingestItem]int64{}, map[*ingestItem]bool{}
	if len(cands) == 0 {
		return inserted, leftOut, nil
	}
	groups := map[usageKey]int{}
	var gk []usageKey
	for _, it := range cands {
		k := usageKey{it.req.Event.EventName, it.req.Event.StripeCustomerID, MonthOf(it.key.EventTS)}
		if _, ok := groups[k]; !ok {
			groups[k] = 0
			gk = append(gk, k)
		}
	}
	// One order for the locks, the exact path's (lockUsage).
	slices.SortFunc(gk, func(a, b usageKey) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.sc, b.sc), a.month.Compare(b.month))
	})
	gNames, gScs, gMonths := make([]string, len(gk)), make([]string, len(gk)), make([]time.Time, len(gk))
	for i, k := range gk {
		groups[k] = i + 1
		gNames[i], gScs[i], gMonths[i] = k.name, k.sc, k.month
	}
	n := len(cands)
	is, gs := make([]int32, n), make([]int32, n)
	ts := make([]time.Time, n)
	ids, names, scs, custs, msgs, streams, fields := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	vals := make([]int64, n)
	for j, it := range cands {
		ev := it.req.Event
		f, err := json.Marshal(it.req.Fields)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding the fields of %s: %w", it.key, err)
		}
		it.fields = f
		is[j], gs[j] = int32(j), int32(groups[usageKey{ev.EventName, ev.StripeCustomerID, MonthOf(it.key.EventTS)}])
		ts[j], ids[j], names[j], scs[j], custs[j] = it.key.EventTS, it.key.Identifier, ev.EventName, ev.StripeCustomerID, ev.CustomerID
		vals[j], msgs[j], streams[j], fields[j] = ev.Value, it.req.MessageID, it.req.Stream, string(f)
	}
	rows, err := l.pool.Query(ctx, insertQueuedSQL, is, ts, ids, names, scs, custs, vals, msgs, streams, fields, gs,
		gNames, gScs, gMonths, now)
	if err != nil {
		return nil, nil, fmt.Errorf("recording %d meter events: %w", n, err)
	}
	var left []int64
	for rows.Next() {
		var i, epoch int64
		if err := rows.Scan(&i, &epoch); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("recording %d meter events: %w", n, err)
		}
		switch {
		case i >= 0:
			inserted[cands[i]] = epoch
		default:
			left = append(left, -i)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("recording %d meter events: %w", n, err)
	}
	for _, g := range left {
		for _, it := range cands {
			if int64(groups[usageKey{it.req.Event.EventName, it.req.Event.StripeCustomerID, MonthOf(it.key.EventTS)}]) == g {
				leftOut[it] = true
			}
		}
	}
	return inserted, leftOut, nil
}

// insertQueuedSQL: $1-$11 the candidates (position, key, event, entry,
// group), $12-$14 their groups (customer-meter and month, in lock order),
// $15 now. It returns (position, epoch) for each event inserted and
// (-group, 0) for each group left out (step 1: also a group with a
// negative value, which the exact path orders); it fails with
// capPassedCode rather than pass a cap (step 4: the division by zero in
// the addition, evaluated on the locked row).
var insertQueuedSQL = `
WITH a AS (
	SELECT * FROM unnest($1::int[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[],
		$8::text[], $9::text[], $10::text[], $11::int[]) AS a(i, ts, id, name, sc, cust, val, msg, stream, fields, g)
), grp AS (
	SELECT g.g, g.name, g.sc, g.month, d.low >= 0 AND (c.cap IS NULL OR CASE WHEN c.counts = 'events'
		THEN coalesce(u.events, 0) + d.events <= c.cap ELSE coalesce(u.units, 0) + d.units <= c.cap END) AS fits
	FROM unnest($12::text[], $13::text[], $14::date[]) WITH ORDINALITY AS g(name, sc, month, g)
	JOIN (SELECT a.g, min(a.val) AS low, sum(a.val) AS units, count(*) AS events FROM a GROUP BY a.g) d ON d.g = g.g
	LEFT JOIN LATERAL (SELECT u.units, u.events FROM {schema}.meter_usage u
		WHERE u.event_name = g.name AND u.stripe_customer_id = g.sc AND u.month = g.month OFFSET 0) u ON true
	LEFT JOIN LATERAL (SELECT c.cap, c.counts ` + applicableSQL("{schema}.meter_caps", "g.name", "g.sc", "g.month") + `) c ON true
), ins AS (
	INSERT INTO {schema}.meter_events AS m (event_ts, identifier, event_name, stripe_customer_id, customer_id, value, status,
		first_sent_at, attempts, epoch, stream_message_id, entry_second, created_at, stream, fields)
	SELECT a.ts, a.id, a.name, a.sc, nullif(a.cust, ''), a.val, 'queued', $15, 1, ` + firstEpoch + `,
		` + entryValuesSQL("nullif(a.msg, '')") + `, $15, a.stream, a.fields::jsonb
	FROM a JOIN grp ON grp.g = a.g AND grp.fits ORDER BY a.ts, a.id
	ON CONFLICT DO NOTHING RETURNING m.event_ts, m.identifier, m.epoch
), w AS (
	SELECT a.i, a.g, a.val, ins.epoch FROM ins JOIN a ON a.ts = ins.event_ts AND a.id = ins.identifier
), counted AS (
	INSERT INTO {schema}.meter_usage AS u (event_name, stripe_customer_id, month, units, events, updated_at)
	SELECT grp.name, grp.sc, grp.month, s.units, s.events, $15
	FROM (SELECT w.g, sum(w.val) AS units, count(*) AS events FROM w GROUP BY w.g) s JOIN grp ON grp.g = s.g ORDER BY grp.g
	ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE
	SET units = u.units + excluded.units + 0 / (CASE WHEN ` + capHoldsSQL + ` THEN 1 ELSE 0 END),
		events = u.events + excluded.events, updated_at = excluded.updated_at
)
SELECT w.i::bigint, w.epoch FROM w
UNION ALL SELECT -grp.g, 0 FROM grp WHERE NOT grp.fits`

// capHoldsSQL: the use after the addition (u plus excluded, values not
// negative) within the cap that applies, true when none.
var capHoldsSQL = `coalesce((SELECT CASE WHEN c.counts = 'events' THEN u.events + excluded.events <= c.cap
		ELSE u.units + excluded.units <= c.cap END ` + applicableSQL("{schema}.meter_caps", "u.event_name", "u.stripe_customer_id", "u.month") + `), true)`

// adopt gives rows a per-event consumer left sending, found by an ingest,
// the stream and fields of their entries (a refusal is dead-lettered from
// them). Nothing is counted: their use was counted when they were sent.
func (l *Ledger) adopt(ctx context.Context, items []*ingestItem) error {
	if len(items) == 0 {
		return nil
	}
	ts, ids, streams, fields := make([]time.Time, len(items)), make([]string, len(items)), make([]string, len(items)), make([]string, len(items))
	for j, it := range items {
		f, err := json.Marshal(it.req.Fields)
		if err != nil {
			return fmt.Errorf("encoding the fields of %s: %w", it.key, err)
		}
		ts[j], ids[j], streams[j], fields[j] = it.key.EventTS, it.key.Identifier, it.req.Stream, string(f)
	}
	_, err := l.pool.Exec(ctx, `UPDATE {schema}.meter_events m SET stream = a.stream, fields = a.fields::jsonb
		FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[]) AS a(ts, id, stream, fields)
		WHERE m.event_ts = a.ts AND m.identifier = a.id AND m.event_ts = ANY($1) AND m.stream IS NULL`, ts, ids, streams, fields)
	if err != nil {
		return fmt.Errorf("adopting %d meter events: %w", len(items), err)
	}
	return nil
}
