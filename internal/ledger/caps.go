package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Cap is a billing period's spend cap: the seed's "vault key" (110 % of the
// expected total) kept in the ledger instead of a third-party proxy.
type Cap struct {
	BillingPeriod string
	CapCents      int64
	ReservedCents int64
	UpdatedAt     time.Time
}

// ErrCapBelowReserved: a cap cannot be set below what is already reserved.
var ErrCapBelowReserved = errors.New("cap is below the amount already reserved for the period")

// SetCap creates or changes a period's cap. Raising a cap is how events
// dead-lettered with reason spend_cap become replayable.
func (l *Ledger) SetCap(ctx context.Context, period string, capCents int64) (Cap, error) {
	if period == "" || capCents < 0 {
		return Cap{}, errors.New("ledger: a cap needs a period and a non-negative amount")
	}
	var c Cap
	err := l.pool.QueryRow(ctx, `
		INSERT INTO {schema}.spend_caps (billing_period, cap_cents, updated_at) VALUES ($1, $2, $3)
		ON CONFLICT (billing_period) DO UPDATE SET cap_cents = EXCLUDED.cap_cents, updated_at = EXCLUDED.updated_at
		RETURNING billing_period, cap_cents, reserved_cents, updated_at`,
		period, capCents, l.clock.Now()).Scan(&c.BillingPeriod, &c.CapCents, &c.ReservedCents, &c.UpdatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName == "reserved_within_cap" {
		cur, _ := l.Cap(ctx, period)
		return Cap{}, fmt.Errorf("setting cap for %s to %d cents: %d cents are already reserved: %w",
			period, capCents, cur.ReservedCents, ErrCapBelowReserved)
	}
	if err != nil {
		return Cap{}, fmt.Errorf("setting cap for %s: %w", period, err)
	}
	return c, nil
}

// Cap reads one period's cap; ErrNotFound when it has none.
func (l *Ledger) Cap(ctx context.Context, period string) (Cap, error) {
	var c Cap
	err := l.pool.QueryRow(ctx, `SELECT billing_period, cap_cents, reserved_cents, updated_at
		FROM {schema}.spend_caps WHERE billing_period = $1`, period).Scan(&c.BillingPeriod, &c.CapCents, &c.ReservedCents, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Cap{}, fmt.Errorf("cap for %s: %w", period, ErrNotFound)
	}
	if err != nil {
		return Cap{}, fmt.Errorf("reading cap for %s: %w", period, err)
	}
	return c, nil
}

// Caps lists every cap, newest period first.
func (l *Ledger) Caps(ctx context.Context) ([]Cap, error) {
	rows, err := l.pool.Query(ctx, `SELECT billing_period, cap_cents, reserved_cents, updated_at
		FROM {schema}.spend_caps ORDER BY billing_period DESC`)
	if err != nil {
		return nil, fmt.Errorf("listing caps: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Cap, error) {
		var c Cap
		err := r.Scan(&c.BillingPeriod, &c.CapCents, &c.ReservedCents, &c.UpdatedAt)
		return c, err
	})
}

// ReserveCap adds amount to period's reservation inside tx (a transaction
// of this ledger's pg.DB, so the schema is named), if the cap allows it. It
// returns the amount reserved (0: no cap and none required), ErrNoCap, or a
// *CapError. The external-ledger reaper reserves through it in the
// transaction that takes its lease, as the consumer does in the one that
// inserts its pending row.
func ReserveCap(ctx context.Context, tx pgx.Tx, period string, amount int64, require bool) (int64, error) {
	return reserveCap(ctx, tx, period, amount, require)
}

// ReleaseCap gives back cents of period's reservation inside tx.
func ReleaseCap(ctx context.Context, tx pgx.Tx, period string, cents int64) error {
	if cents <= 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE {schema}.spend_caps SET reserved_cents = greatest(0, reserved_cents - $2),
		updated_at = now() WHERE billing_period = $1`, period, cents)
	if err != nil {
		return fmt.Errorf("releasing spend cap for %s: %w", period, err)
	}
	return nil
}
