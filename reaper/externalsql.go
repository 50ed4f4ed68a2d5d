package reaper

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/pg"
)

// Every statement pelguard runs against a team's own table (the
// --external-ledger mode) is in this file. The table is named by
// pgx.Identifier from the configured schema-qualified name, never by the
// {schema} token (it is not pelguard's), and only the statements the team's
// consumer itself runs are run: its pre-flight SELECT and its INSERT … ON
// CONFLICT DO NOTHING (invariant 8: nothing else of the team's is written).

// teamTable is the team's billing table: the article's columns customer_id,
// billing_period, charge_id, status (and, for the INSERT, amount_cents,
// error, created_at). A view can serve another shape for the reads.
type teamTable struct {
	name      string // as configured, for messages
	ident     string // quoted, schema-qualified
	insertSQL string // Config.ExternalInsert; empty: the article's INSERT
}

// parseTeamTable reads "schema.table". Both parts are required: an
// unqualified name would resolve through search_path, possibly to
// pelguard's own billing_records.
func parseTeamTable(s string) (teamTable, error) {
	id, err := pg.TeamTable("--external-ledger", s)
	if err != nil {
		return teamTable{}, err
	}
	return teamTable{name: s, ident: id.Sanitize()}, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// lookup reads the team's rows for keys, as ledger records holding only the
// key, ChargeID, Status and LastError.
func (t teamTable) lookup(ctx context.Context, q querier, keys []ledger.Key) (map[ledger.Key]ledger.Record, error) {
	out := make(map[ledger.Key]ledger.Record, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	custs := make([]string, len(keys))
	periods := make([]string, len(keys))
	for i, k := range keys {
		custs[i], periods[i] = k.CustomerID, k.BillingPeriod
	}
	rows, err := q.Query(ctx, `SELECT t.customer_id, t.billing_period, COALESCE(t.charge_id, ''), COALESCE(t.status, '')
		FROM `+t.ident+` t JOIN unnest($1::text[], $2::text[]) AS k(c, p)
		ON t.customer_id = k.c AND t.billing_period = k.p`, custs, periods)
	if err != nil {
		return nil, fmt.Errorf("reading the team's %s: %w", t.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var rec ledger.Record
		var status string
		if err := rows.Scan(&rec.CustomerID, &rec.BillingPeriod, &rec.ChargeID, &status); err != nil {
			return nil, fmt.Errorf("reading the team's %s: %w", t.name, err)
		}
		rec.Status = ledger.Status(status)
		out[rec.Key] = rec
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the team's %s: %w", t.name, err)
	}
	return out, nil
}

// insert writes the outcome as the team's consumer does: 'charged' with the
// charge, or 'card_declined' with the error and no charge; ON CONFLICT DO
// NOTHING, so a row the team wrote meanwhile wins.
func (t teamTable) insert(ctx context.Context, q querier, k ledger.Key, chargeID string, amount int64, status, errText string) error {
	var err error
	switch {
	case t.insertSQL != "":
		var charge, errArg *string
		if status == teamDeclined {
			errArg = &errText
		} else {
			charge = &chargeID
		}
		_, err = q.Exec(ctx, t.insertSQL, k.CustomerID, k.BillingPeriod, charge, amount, status, errArg)
	case status == teamDeclined:
		_, err = q.Exec(ctx, `INSERT INTO `+t.ident+`
			(customer_id, billing_period, charge_id, amount_cents, status, error, created_at)
			VALUES ($1, $2, NULL, $3, 'card_declined', $4, NOW())
			ON CONFLICT (customer_id, billing_period) DO NOTHING`, k.CustomerID, k.BillingPeriod, amount, errText)
	default:
		_, err = q.Exec(ctx, `INSERT INTO `+t.ident+`
			(customer_id, billing_period, charge_id, amount_cents, status, created_at)
			VALUES ($1, $2, $3, $4, 'charged', NOW())
			ON CONFLICT (customer_id, billing_period) DO NOTHING`, k.CustomerID, k.BillingPeriod, chargeID, amount)
	}
	if err != nil {
		return fmt.Errorf("writing %s for %s to the team's %s: %w", status, k, t.name, err)
	}
	return nil
}
