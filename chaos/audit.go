package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/pelguard/pelguard/audit"
	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/stripeapi"
)

// runCell runs one scenario in one mode, then the auditor over its charges
// (and, for the naive run, `auditor refund`), and counts the money. When the
// cell cannot finish, its result says why (Result.Error) with the counts it
// had reached, so the report shows the failed row instead of dropping it.
func (d *drill) runCell(ctx context.Context, scenario, mode string, n, total int) (res Result, err error) {
	res = Result{Scenario: scenario, Mode: mode, Events: d.cfg.Events}
	c, cleanup, err := d.newCell(ctx, scenario, mode, n)
	defer cleanup() // deferred first: runs after the failure is counted below
	d.prep.start()  // this cell's migration is done: the background may make the usage schema
	if err != nil {
		res.Error = redact.String(err.Error())
		d.progress.fail(nil, n, total, scenario, mode, 0, res.Error)
		return res, err
	}
	d.progress.start(c, n, total)
	defer func() {
		if err == nil {
			return
		}
		res.Charges = c.billable()
		res.DuplicateCharges, res.DuplicateCents = c.duplicates()
		res.Error = redact.String(err.Error())
		res.Elapsed = time.Since(c.started)
		d.progress.fail(c, n, total, scenario, mode, res.Elapsed, res.Error)
	}()
	run := map[string]func(context.Context, *cell) error{
		ScenarioInflightReclaim: inflightReclaim,
		ScenarioPartialBatch:    partialBatch,
		ScenarioAOFRollback:     aofRollback,
		ScenarioExpiredKey:      expiredKey,
	}[scenario]
	if err := run(ctx, c); err != nil {
		return res, err
	}

	res.Charges = c.billable()
	res.DuplicateCharges, res.DuplicateCents = c.duplicates()
	d.progress.update(c, "auditing")
	if err := c.audit(ctx, &res); err != nil {
		return res, err
	}
	res.NetDuplicates, _ = c.duplicates()
	res.Elapsed = time.Since(c.started)
	d.progress.finish(c, res)
	return res, nil
}

// audit runs the auditor over the cell's window, with --legacy for the
// naive charges (they carry only the seed's description), and refunds the
// naive run's duplicates the way `auditor refund` does.
func (c *cell) audit(ctx context.Context, res *Result) error {
	a, err := audit.New(c.auditConfig())
	if err != nil {
		return fmt.Errorf("building the auditor: %w", err)
	}
	// A manual window covering the whole cell, whatever the clocks did.
	w := audit.Window{From: c.started.Add(-time.Hour), To: c.clk.Now().Add(time.Hour)}
	rep, err := a.Run(ctx, w)
	if err != nil {
		return fmt.Errorf("auditing: %w", err)
	}
	for _, f := range rep.Findings {
		if f.Kind == audit.KindDuplicate {
			res.Flagged++
		} else {
			res.OtherFindings++
			c.log.Warn("chaos: the auditor reported an unexpected finding", "kind", f.Kind, "charge", f.ChargeID,
				"customer", f.CustomerID, "detail", f.Detail)
		}
	}
	if c.mode != ModeNaive {
		return nil
	}
	// Caps high enough for every duplicate the drill can make: the drill
	// shows the refund undoing the whole naive run.
	rr, err := a.Refund(ctx, audit.RefundOptions{MaxRefunds: noCap, MaxCents: noCapCents, LockWait: 2 * time.Minute})
	if err != nil {
		return fmt.Errorf("refunding the naive run's duplicates: %w", err)
	}
	res.Refunded = len(rr.Refunded)
	res.RefundStoppedBy = rr.StoppedBy
	return nil
}

// noCap and noCapCents lift the auditor's refund caps for the drill.
const (
	noCap            = 1 << 30
	noCapCents int64 = 1 << 50
)

// auditConfig is the auditor the cell runs. Production's refund caps (per
// run and rolling 24 h) bound what a bug in the auditor could give away at
// the real Stripe; the drill refunds only charges it made itself, on its own
// emulator and in its own schema, and must show the refund undoing every
// duplicate whatever --events is, so it lifts them all. The rolling caps
// count refund_ledger, which is per schema, so no other cell or run shares
// them.
func (c *cell) auditConfig() audit.Config {
	return audit.Config{
		DB:     c.pool,
		Schema: c.schema,
		Stripe: stripeapi.Config{APIKey: stripeKey, BaseURL: c.sim.URL(), MaxNetworkRetries: -1},
		Logger: c.log,
		// The cell's clock: expired-key moves it a day ahead with the
		// emulator, and the auditor must judge leases on the same time.
		Clock:  c.clk,
		Legacy: c.mode == ModeNaive,
		// The drill's events pay one customer per Stripe customer: said
		// here, as a team would say it, so the naive run's duplicates are
		// refundable.
		OneCustomerPerStripeCustomer: c.mode == ModeNaive,
		// The lock is database-wide; parallel drills (tests) take turns.
		LockWait:      2 * time.Minute,
		MaxRefunds:    noCap,
		MaxCents:      noCapCents,
		MaxRefunds24h: noCap,
		MaxCents24h:   noCapCents,
	}
}
