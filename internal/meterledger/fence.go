package meterledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxLiveEpoch is the highest epoch a holder of a meter event may present
// (a sending row's), read in tx: a detected rollback raises the epoch floor
// past it, as past billing_records' and external_leases'. tx must be a
// transaction of a pg.DB (its statements name {schema}).
func MaxLiveEpoch(ctx context.Context, tx pgx.Tx) (int64, error) {
	var e int64
	if err := tx.QueryRow(ctx, `SELECT greatest((SELECT coalesce(max(epoch), 0) FROM {schema}.meter_events WHERE status = 'sending'),
		(SELECT coalesce(max(epoch), 0) FROM {schema}.meter_aggregates WHERE status = 'sending'))`).Scan(&e); err != nil {
		return 0, fmt.Errorf("reading the live meter event epochs: %w", err)
	}
	return e, nil
}

// Fence is meter events' share of the fence a detected rollback raises
// (internal/rollback), run in the transaction that raises the epoch floor
// to floor: every sending row moves to floor + 1 and loses its lease, so no
// holder from before the rollback passes a fenced write, and every slot is
// freed (their holders are fenced). The rows stay sending: re-sent under
// their identifiers within the safe window, parked past it. It returns the
// rows fenced. tx must be a transaction of a pg.DB.
func Fence(ctx context.Context, tx pgx.Tx, floor int64) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE {schema}.meter_events SET epoch = $1::bigint + 1, lease_owner = NULL, lease_expires_at = NULL
		WHERE status = 'sending'`, floor)
	if err != nil {
		return 0, fmt.Errorf("fencing meter events after a rollback: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE {schema}.meter_aggregates SET epoch = $1::bigint + 1, lease_owner = NULL, lease_expires_at = NULL
		WHERE status = 'sending'`, floor); err != nil {
		return 0, fmt.Errorf("fencing meter aggregates after a rollback: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM {schema}.meter_inflight`); err != nil {
		return 0, fmt.Errorf("freeing meter slots after a rollback: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Stuck lists up to limit events still sending whose first attempt is older
// than olderThan and that nobody holds (no lease, or an expired one), the
// oldest first: unknown outcomes no delivery is re-sending. Past the safe
// window they can only be parked; an alert before then lets a person look
// while Stripe still guards their identifiers. A row never sent (given
// back unsent: 0 attempts) is not one.
func (l *Ledger) Stuck(ctx context.Context, olderThan time.Time, limit int) ([]Record, error) {
	now := l.clock.Now()
	rows, err := l.pool.Query(ctx, `SELECT `+recordCols+` FROM {schema}.meter_events m
		WHERE m.status = 'sending' AND m.attempts > 0 AND m.first_sent_at < $1 AND (m.lease_expires_at IS NULL OR m.lease_expires_at <= $2)
		ORDER BY m.first_sent_at LIMIT $3`, olderThan, now, limit)
	if err != nil {
		return nil, fmt.Errorf("listing stuck meter events: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, _, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("scanning meter event: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
