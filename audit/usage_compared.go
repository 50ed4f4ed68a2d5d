package audit

import (
	"context"
	"fmt"
	"time"
)

// What each run compared, per meter and Stripe customer (migration 00030,
// usage_compared): the console's Usage page says when a customer-meter
// was last compared and what is not compared yet, and never calls
// agreement what nobody compared.

// comparedKeep is how long a customer-meter no run compares keeps its row
// (past the 35 days Stripe keeps events for).
const comparedKeep = 40 * 24 * time.Hour

// recordCompared upserts, for each customer of one page of meter, what the
// run compared: its span and the windows it held back (their delivery not
// settled). One statement per page.
func (s *Store) recordCompared(ctx context.Context, run int64, eventName string, sp usageSpan, results []customerResult, now time.Time) error {
	if len(results) == 0 {
		return nil
	}
	cs := make([]string, len(results))
	windows := make([]int64, len(results))
	held := make([]int32, len(results))
	heldFrom := make([]*time.Time, len(results))
	for i, r := range results {
		cs[i], windows[i], held[i] = r.customer, r.windows, int32(len(r.held))
		for _, h := range r.held {
			if heldFrom[i] == nil || h[0].Before(*heldFrom[i]) {
				t := h[0]
				heldFrom[i] = &t
			}
		}
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO {schema}.usage_compared AS c (event_name, stripe_customer_id, run_id, compared_at,
			compared_from, compared_to, windows, held_windows, held_from)
		SELECT $1, x.c, $2, $3, $4, $5, x.w, x.h, x.hf FROM unnest($6::text[], $7::bigint[], $8::int[], $9::timestamptz[]) AS x(c, w, h, hf)
		ON CONFLICT (event_name, stripe_customer_id) DO UPDATE SET run_id = excluded.run_id, compared_at = excluded.compared_at,
			compared_from = excluded.compared_from, compared_to = excluded.compared_to, windows = excluded.windows,
			held_windows = excluded.held_windows, held_from = excluded.held_from`,
		eventName, run, now, sp.dailyFrom, sp.to, cs, windows, held, heldFrom)
	if err != nil {
		return fmt.Errorf("recording what usage run %d compared: %w", run, err)
	}
	return nil
}

// forgetCompared deletes the rows no run has rewritten for comparedKeep.
func (s *Store) forgetCompared(ctx context.Context, now time.Time) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM {schema}.usage_compared WHERE compared_at < $1`, now.Add(-comparedKeep)); err != nil {
		return fmt.Errorf("forgetting old usage comparisons: %w", err)
	}
	return nil
}
