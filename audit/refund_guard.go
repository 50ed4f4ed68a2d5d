package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// SkipCode names why a refund run left a duplicate open. The refund
// runbook (docs/operations/findings-and-refunds.md) has one row per code.
type SkipCode string

// Why a duplicate was not refunded. Refusals (the finding is no longer a
// plain duplicate) need a person; caps and transient errors clear on a
// later run.
const (
	SkipNoCharge              SkipCode = "no_charge"               // the finding names no charge, or nothing is left
	SkipLedgerRecordsCharge   SkipCode = "ledger_records_charge"   // the ledger records this charge: it is a canonical
	SkipLedgerOtherCanonical  SkipCode = "ledger_other_canonical"  // the ledger records a charge other than the finding's canonical
	SkipLedgerPending         SkipCode = "ledger_pending"          // the key's ledger row is pending: a charge is in motion
	SkipCanonicalMissing      SkipCode = "canonical_missing"       // Stripe may not have the canonical charge
	SkipCanonicalRefunded     SkipCode = "canonical_refunded"      // the canonical was refunded, wholly or partly
	SkipCanonicalDisputed     SkipCode = "canonical_disputed"      // the canonical is disputed
	SkipCanonicalNotSucceeded SkipCode = "canonical_not_succeeded" // the canonical is not succeeded
	SkipDuplicateChanged      SkipCode = "duplicate_changed"       // refunded, disputed or changed since the audit
	SkipAmountDiffers         SkipCode = "amount_differs"          // a legacy duplicate of another amount or currency than its canonical
	SkipStripeRefused         SkipCode = "stripe_refused"          // Stripe refused the refund
	SkipTransient             SkipCode = "transient"               // a transient Stripe error; a later run retries
	SkipMaxRefunds            SkipCode = "max_refunds"             // the run's --max-refunds
	SkipMaxCents              SkipCode = "max_cents"               // the run's --max-cents
	SkipMaxRefunds24h         SkipCode = "max_refunds_24h"         // the rolling --max-refunds-24h
	SkipMaxCents24h           SkipCode = "max_cents_24h"           // the rolling --max-cents-24h
	SkipLedgerRollback        SkipCode = "ledger_rollback"         // the ledger lost commits and is being repaired from Stripe
)

func (c SkipCode) isCap() bool {
	return c == SkipMaxRefunds || c == SkipMaxCents || c == SkipMaxRefunds24h || c == SkipMaxCents24h
}

// capName is the cap's flag name, as RefundReport.StoppedBy spells it.
func (c SkipCode) capName() string { return strings.ReplaceAll(string(c), "_", "-") }

type skip struct {
	code   SkipCode
	reason string
}

func skipf(code SkipCode, format string, args ...any) *skip {
	return &skip{code: code, reason: fmt.Sprintf(format, args...)}
}

// lockRefundLedger serialises every refunder's cap check and record, in
// any process: the rolling cap is summed and the refund recorded under it.
// It is taken after the key's lock; nothing takes them in the other order.
const lockRefundLedger = `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/refund_ledger', 0))`

// refundOne refunds f or says why not. It holds f's key lock (shared by the
// ledger's writes that record a charge) and the refund ledger's lock from
// its re-read of the ledger and Stripe until the refund is recorded.
func (a *Auditor) refundOne(ctx context.Context, f Finding, run *refundRun) (string, *skip, error) {
	switch {
	case f.ChargeID == "" || f.CanonicalChargeID == "":
		return "", skipf(SkipNoCharge, "the finding names no charge or no canonical charge"), nil
	case f.ChargeID == f.CanonicalChargeID:
		return "", skipf(SkipLedgerRecordsCharge, "the charge is the canonical charge"), nil
	case f.AmountCents <= 0:
		return "", skipf(SkipNoCharge, "nothing left to refund"), nil
	case run.n >= run.maxN:
		return "", skipf(SkipMaxRefunds, "the run reached --max-refunds %d", run.maxN), nil
	case run.cents+f.AmountCents > run.maxCents:
		return "", skipf(SkipMaxCents, "%d more would pass the run's --max-cents %d (%d used)", f.AmountCents, run.maxCents, run.cents), nil
	case a.cfg.Witness != nil && a.cfg.Witness.Suspect():
		// The ledger may lack rows and refunds the failover erased: its
		// canonical charges and the rolling cap are not to be trusted
		// until the repair from Stripe has rebuilt them.
		return "", skipf(SkipLedgerRollback, "the ledger lost commits (a failover or a restore) and is being repaired from Stripe; a later run refunds"), nil
	}
	tx, err := a.ledger.Begin(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("starting the refund of %s: %w", f.ChargeID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The key's lock, and its Stripe customer's: a legacy finding may not
	// know its team customer, and an import or a consumer recording this
	// charge for any key of that Stripe customer and period waits for it.
	// Always in this order (key, then Stripe customer), so two refunds
	// cannot deadlock.
	if err := a.ledger.LockKey(ctx, tx, ledger.Key{CustomerID: f.CustomerID, BillingPeriod: f.BillingPeriod}); err != nil {
		return "", nil, err
	}
	if err := a.ledger.LockKey(ctx, tx, ledger.StripeLockKey(f.StripeCustomerID, f.BillingPeriod)); err != nil {
		return "", nil, err
	}
	if _, err := tx.Exec(ctx, lockRefundLedger, a.ledger.Schema()); err != nil {
		return "", nil, fmt.Errorf("taking the refund ledger lock: %w", err)
	}
	if sk, err := a.ledgerRefusal(ctx, f); sk != nil || err != nil {
		return "", sk, err
	}
	if sk, err := a.stripeRefusal(ctx, f); sk != nil || err != nil {
		return "", sk, err
	}
	used, err := a.rollingUsage(ctx, tx)
	if err != nil {
		return "", nil, err
	}
	if run.opts.DryRun { // a dry run records nothing: count what it would have
		used.n, used.cents = used.n+run.n, used.cents+run.cents
	}
	if used.n+1 > a.cfg.MaxRefunds24h {
		return "", skipf(SkipMaxRefunds24h, "%d refunds in the last 24 h reach --max-refunds-24h %d", used.n, a.cfg.MaxRefunds24h), nil
	}
	if used.cents+f.AmountCents > a.cfg.MaxCents24h {
		return "", skipf(SkipMaxCents24h, "%d more would pass --max-cents-24h %d (%d refunded in the last 24 h)",
			f.AmountCents, a.cfg.MaxCents24h, used.cents), nil
	}
	if hook := a.cfg.Test.BeforeRefund; hook != nil {
		hook(f)
	}
	// The refund is made and recorded in this transaction: only while this
	// run still holds its lease (one whose heartbeat just failed may not
	// know yet), and a run taking the lease over waits for it to commit.
	if l := heldLease(ctx); l != nil {
		if err := l.checkHeld(ctx, tx); err != nil {
			return "", nil, err
		}
	}
	if run.opts.DryRun {
		run.n, run.cents = run.n+1, run.cents+f.AmountCents
		return "", nil, nil
	}
	// The audited amount, which the re-read just confirmed is what the
	// duplicate still holds: a refund by hand in between makes Stripe
	// refuse rather than refund more than was checked.
	re, err := a.stripe.Refund(ctx, f.ChargeID, f.AmountCents, RefundKeyPrefix+f.ChargeID)
	if err != nil {
		if ctx.Err() != nil {
			return "", nil, fmt.Errorf("refunding duplicate %s (finding %d): %w", f.ChargeID, f.ID, err)
		}
		a.alertKey(err)
		if errors.Is(err, stripeapi.ErrTransient) {
			return "", skipf(SkipTransient, "transient Stripe error, a later run retries: %v", err), nil
		}
		// Permanent for this charge (a closed account, a refund Stripe
		// will not make): skip it, say why, and go on.
		return "", skipf(SkipStripeRefused, "Stripe refused the refund: %v", err), nil
	}
	// Stripe has refunded: record it even if the caller gives up now, or
	// the next run would refund again (the key would then replay the same
	// refund, but only within 24 hours).
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := a.recordRefund(mctx, tx, f, re, run.opts.Source); err != nil {
		return "", nil, err
	}
	seq, err := ledger.BumpWitness(mctx, tx, a.witness(), a.cfg.Clock.Now())
	if err != nil {
		return "", nil, err
	}
	if err := tx.Commit(mctx); err != nil {
		return "", nil, fmt.Errorf("recording refund %s of %s (finding %d): %w", re.ID, f.ChargeID, f.ID, err)
	}
	if seq > 0 {
		a.cfg.Witness.Committed(seq)
		if err := a.cfg.Witness.Mirror(mctx); err != nil {
			a.log.Warn("the refund is recorded but its witness is not mirrored to Redis", "refund", re.ID, "err", err)
		}
	}
	run.n, run.cents = run.n+1, run.cents+re.AmountCents
	return re.ID, nil, nil
}

// ledgerRefusal is invariant 6 checked against the source of truth at the
// moment of the refund, under the key's lock: no ledger row may record
// this charge, whatever customer the finding names (a legacy finding may
// name none, an import may have recorded it since the audit), and the key's
// row must still record the finding's canonical charge.
func (a *Auditor) ledgerRefusal(ctx context.Context, f Finding) (*skip, error) {
	recs, err := a.byChargeIDs(ctx, []string{f.ChargeID})
	if err != nil {
		return nil, fmt.Errorf("checking the ledger before refunding %s: %w", f.ChargeID, err)
	}
	if r, ok := recs[f.ChargeID]; ok {
		return skipf(SkipLedgerRecordsCharge, "the ledger records this charge as %s's charge", r.Key), nil
	}
	if f.CustomerID != "" && f.BillingPeriod != "" {
		k := ledger.Key{CustomerID: f.CustomerID, BillingPeriod: f.BillingPeriod}
		r, err := a.get(ctx, k)
		switch {
		case errors.Is(err, ledger.ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("reading the ledger row of %s before refunding %s: %w", k, f.ChargeID, err)
		case r.Status == ledger.StatusPending:
			return skipf(SkipLedgerPending, "the ledger row of %s is pending: a charge of the key is in motion", k), nil
		case r.Status == ledger.StatusProcessing:
			return skipf(SkipLedgerPending, "the ledger row of %s is processing: its charge %s is a debit still in motion", k, r.ChargeID), nil
		case r.Status == ledger.StatusCharged && r.ChargeID != f.CanonicalChargeID:
			return skipf(SkipLedgerOtherCanonical, "the ledger records %s for %s, not the finding's canonical %s",
				r.ChargeID, k, f.CanonicalChargeID), nil
		}
	}
	missing, err := a.store.openMissing(ctx, f.CanonicalChargeID)
	if err != nil {
		return nil, err
	}
	if missing {
		return skipf(SkipCanonicalMissing, "the canonical charge has an open missing_charge finding"), nil
	}
	return nil, nil
}

// stripeRefusal re-reads both charges at Stripe: the duplicate is refunded
// only while the canonical still holds the whole payment and the duplicate
// is what the audit saw.
func (a *Auditor) stripeRefusal(ctx context.Context, f Finding) (*skip, error) {
	canon, sk, err := a.reread(ctx, f.CanonicalChargeID, SkipCanonicalMissing)
	if sk != nil || err != nil {
		return sk, err
	}
	switch {
	case canon.Status != "succeeded":
		return skipf(SkipCanonicalNotSucceeded, "the canonical charge %s is %s", canon.ID, canon.Status), nil
	case canon.Disputed:
		return skipf(SkipCanonicalDisputed, "the canonical charge %s is disputed", canon.ID), nil
	case canon.Refunded || canon.AmountRefundedCents > 0:
		return skipf(SkipCanonicalRefunded, "the canonical charge %s was refunded (%d of %d)",
			canon.ID, canon.AmountRefundedCents, canon.AmountCents), nil
	}
	dup, sk, err := a.reread(ctx, f.ChargeID, SkipDuplicateChanged)
	if sk != nil || err != nil {
		return sk, err
	}
	net := dup.AmountCents - dup.AmountRefundedCents
	switch {
	case dup.Status != "succeeded":
		return skipf(SkipDuplicateChanged, "the duplicate is %s", dup.Status), nil
	case dup.Disputed:
		return skipf(SkipDuplicateChanged, "the duplicate was disputed since the audit"), nil
	case net <= 0:
		return skipf(SkipDuplicateChanged, "the duplicate was refunded since the audit"), nil
	case net != f.AmountCents:
		return skipf(SkipDuplicateChanged, "the duplicate holds %d, the finding %d: it was partly refunded since the audit",
			net, f.AmountCents), nil
	case f.Legacy && (dup.AmountCents != canon.AmountCents || !strings.EqualFold(dup.Currency, canon.Currency)):
		// An old consumer's charge names no customer: one of another
		// amount may be the only charge of another customer paying with
		// the same Stripe customer (issue 25), whatever an older finding
		// said.
		return skipf(SkipAmountDiffers, "the legacy charge is %d %s, the canonical %d %s: it may be another customer's only charge",
			dup.AmountCents, dup.Currency, canon.AmountCents, canon.Currency), nil
	}
	return nil, nil
}

// reread reads one charge; a charge Stripe does not have is skipped with
// gone, a transient error skipped for a later run, anything else fails the
// run (a key that lacks a permission fails every refund alike).
func (a *Auditor) reread(ctx context.Context, id string, gone SkipCode) (stripeapi.Charge, *skip, error) {
	ch, err := a.stripe.GetCharge(ctx, id)
	switch {
	case err == nil:
		return ch, nil, nil
	case ctx.Err() != nil:
		return ch, nil, err
	case errors.Is(err, stripeapi.ErrNoSuchCharge):
		return ch, skipf(gone, "Stripe has no charge %s", id), nil
	case errors.Is(err, stripeapi.ErrTransient):
		return ch, skipf(SkipTransient, "transient Stripe error re-reading %s, a later run retries: %v", id, err), nil
	}
	a.alertKey(err)
	return ch, nil, fmt.Errorf("re-reading %s before refunding: %w", id, err)
}

type usage struct {
	n     int
	cents int64
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// rollingUsage sums the refunds pelguard made in the last 24 h, whoever
// asked: the rolling cap.
func (a *Auditor) rollingUsage(ctx context.Context, q queryRower) (usage, error) {
	var u usage
	err := q.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0) FROM {schema}.refund_ledger
		WHERE refunded_at > $1`, a.cfg.Clock.Now().Add(-24*time.Hour)).Scan(&u.n, &u.cents)
	if err != nil {
		return u, fmt.Errorf("summing the refunds of the last 24 h: %w", err)
	}
	return u, nil
}

// recordRefund writes the refund to refund_ledger and the finding, in the
// transaction that holds the locks.
func (a *Auditor) recordRefund(ctx context.Context, tx pgx.Tx, f Finding, re stripeapi.Refund, source string) error {
	at := a.cfg.Clock.Now()
	if _, err := tx.Exec(ctx, `INSERT INTO {schema}.refund_ledger (refunded_at, charge_id, refund_id, amount_cents,
			currency, customer_id, billing_period, finding_id, source)
		VALUES ($1, $2, $3, $4, $5, nullif($6, ''), nullif($7, ''), $8, $9)`,
		at, f.ChargeID, re.ID, re.AmountCents, f.Currency, f.CustomerID, f.BillingPeriod, f.ID, source); err != nil {
		return fmt.Errorf("recording refund %s of %s in refund_ledger: %w", re.ID, f.ChargeID, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE {schema}.audit_findings SET state = 'refunded', refund_id = $2,
		refunded_cents = $3, refunded_at = $4, refund_skip_reason = NULL, refund_skipped_at = NULL, updated_at = now()
		WHERE id = $1 AND state = 'open'`, f.ID, re.ID, re.AmountCents, at)
	if err != nil {
		return fmt.Errorf("recording refund %s on finding %d: %w", re.ID, f.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("recording refund %s on finding %d: %w", re.ID, f.ID, ErrState)
	}
	return nil
}

// recordSkip notes on the finding why its last refund attempt left it
// open; failing to note it is logged, not fatal.
func (a *Auditor) recordSkip(ctx context.Context, id int64, sk skip) {
	_, err := a.ledger.DB().Exec(ctx, `UPDATE {schema}.audit_findings SET refund_skip_reason = $2, refund_skipped_at = $3,
		updated_at = now() WHERE id = $1 AND state = 'open'`, id, string(sk.code)+": "+sk.reason, a.cfg.Clock.Now())
	if err != nil {
		a.log.Warn("recording why a refund was skipped", "finding_id", id, "error", err)
	}
}

// witness is the process's ledger witness, or nil (a nil *Monitor in the
// interface would not be nil).
func (a *Auditor) witness() ledger.Witness {
	if a.cfg.Witness == nil {
		return nil
	}
	return a.cfg.Witness
}
