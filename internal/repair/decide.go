package repair

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// batch is how many keys' rows are read per ledger query.
const batch = 500

func holds(ch stripeapi.Charge) bool { return ch.AmountCents-ch.AmountRefundedCents > 0 }

func live(ch stripeapi.Charge) bool { return ch.Status == "succeeded" || ch.Status == "pending" }

// attemptOf is the attempt whose key made a pelguard charge: its attempt
// metadata, 1 when absent (attempt 1 adds none).
func attemptOf(ch stripeapi.Charge) int {
	if n, err := strconv.Atoi(ch.Metadata[stripeapi.MetaAttempt]); err == nil && n >= 1 {
		return n
	}
	return 1
}

func rebuilt(k ledger.Key, ch stripeapi.Charge, key string, attempt int) ledger.RebuiltCharge {
	return ledger.RebuiltCharge{Key: k, StripeCustomerID: ch.StripeCustomerID, AmountCents: ch.AmountCents,
		Currency: strings.ToLower(ch.Currency), IdempotencyKey: key, Attempt: attempt, ChargeID: ch.ID,
		PaymentIntentID: ch.PaymentIntentID, Pending: ch.Status == "pending", Created: ch.Created}
}

// decideMarked rebuilds the keys of pelguard's charges, a batch of keys at
// a time.
func (r *run) decideMarked(ctx context.Context) error {
	keys := r.sortedKeys()
	r.progress("deciding %d keys against the ledger", len(keys))
	for start := 0; start < len(keys); start += batch {
		part := keys[start:min(start+batch, len(keys))]
		rows, err := r.l.Lookup(ctx, part)
		if err != nil {
			return err
		}
		var ids []string
		for _, k := range part {
			for _, ch := range r.marked[k] {
				ids = append(ids, ch.ID)
			}
		}
		refunded, err := r.l.RefundedCharges(ctx, ids)
		if err != nil {
			return err
		}
		for _, k := range part {
			rec, ok := rows[k]
			if err := r.decideKey(ctx, k, r.marked[k], rec, ok, refunded); err != nil {
				return err
			}
		}
		if start+batch < len(keys) {
			r.progress("decided %d of %d keys", start+batch, len(keys))
		}
	}
	return nil
}

// decideKey decides one key of pelguard's charges (chs, any status)
// against its row (ok=false: none). The canonical charge is the one the
// row names, while it still holds money; else stripeapi.Canonical of the
// charges that are live (succeeded, or pending: a debit in motion) and
// that pelguard did not refund as duplicates.
func (r *run) decideKey(ctx context.Context, k ledger.Key, chs []stripeapi.Charge, rec ledger.Record, ok bool,
	refunded map[string]bool) error {
	key := event.IdempotencyKey(k.CustomerID, k.BillingPeriod, r.cfg.Namespace)
	var cands []stripeapi.Charge
	for _, ch := range chs {
		if live(ch) && !refunded[ch.ID] {
			cands = append(cands, ch)
		}
	}
	named := func(id string) (stripeapi.Charge, bool) {
		i := slices.IndexFunc(chs, func(c stripeapi.Charge) bool { return c.ID == id })
		if i < 0 {
			return stripeapi.Charge{}, false
		}
		return chs[i], true
	}
	if ok && rec.Status == ledger.StatusCharged {
		// Never another charge for a charged row. Its own charge may be
		// older than Since; a second one is the auditor's duplicate.
		if _, mine := named(rec.ChargeID); !mine && slices.ContainsFunc(cands, holds) {
			r.rep.Findings++
			r.note("%s: the ledger records charge %s; Stripe also has %s since %s: left as it is (the auditor judges it)",
				k, rec.ChargeID, cands[slices.IndexFunc(cands, holds)].ID, r.since)
		}
		return nil
	}
	var canon stripeapi.Charge
	found, replaces := false, ""
	if ok && rec.Status == ledger.StatusProcessing {
		ch, known := named(rec.ChargeID)
		if !known {
			// The debit is older than Since: read it.
			got, err := r.cfg.Stripe.GetCharge(ctx, rec.ChargeID)
			switch {
			case errors.Is(err, stripeapi.ErrNoSuchCharge):
			case err != nil:
				return fmt.Errorf("reading %s's debit %s: %w", k, rec.ChargeID, err)
			default:
				ch, known = got, true
			}
		}
		if known && live(ch) && holds(ch) && !refunded[ch.ID] {
			canon, found = ch, true
		} else {
			replaces = rec.ChargeID // the debit is over (failed, refunded, gone)
		}
	}
	if !found {
		canon, found = stripeapi.Canonical(cands)
	}
	switch {
	case !found:
		if slices.ContainsFunc(chs, func(c stripeapi.Charge) bool { return refunded[c.ID] }) {
			r.rep.Findings++
			r.note("%s: every charge of the key since %s was refunded by pelguard as a duplicate; its canonical charge is older: left as it is",
				k, r.since)
		}
		return nil
	case ok && rec.ChargeID == canon.ID && rec.Status == ledger.StatusProcessing && canon.Status == "pending":
		return nil // in motion, as the ledger says
	case !holds(canon):
		return r.refundedOnly(ctx, k, key, canon, rec, ok)
	}
	c := rebuilt(k, canon, key, attemptOf(canon))
	c.Replaces = replaces
	res, err := r.l.Rebuild(ctx, c)
	if err != nil {
		return err
	}
	r.record(res, c)
	if res.OverCap {
		r.log.Warn("a rebuilt charge passes its period's spend cap", "key", k.String(), "charge_id", canon.ID)
	}
	return nil
}

// refundedOnly records a key whose only live charges hold no money.
func (r *run) refundedOnly(ctx context.Context, k ledger.Key, key string, ch stripeapi.Charge, rec ledger.Record, ok bool) error {
	row := "no row"
	if ok {
		row = "a " + string(rec.Status) + " row"
	}
	detail := fmt.Sprintf("the ledger's repair after a loss of commits found only fully refunded charges of this key at Stripe "+
		"(earliest %s, %d %s); the ledger has %s. Not recorded as charged: were the refunds meant? "+
		"Bill again by hand if not, record the charge if they were, then resolve", ch.ID, ch.AmountCents, ch.Currency, row)
	recorded, _, err := r.l.RecordRefundedOnly(ctx, ledger.RefundedOnly{Key: k, StripeCustomerID: ch.StripeCustomerID,
		IdempotencyKey: key, ChargeID: ch.ID, AmountCents: ch.AmountCents, Currency: strings.ToLower(ch.Currency), Detail: detail})
	if err != nil {
		return err
	}
	if recorded {
		r.rep.Findings++
		r.note("%s: only fully refunded charges at Stripe (earliest %s): a refunded_only finding, not recorded as charged", k, ch.ID)
	}
	r.periods[k.BillingPeriod] = true
	return nil
}

// lookUpUnmarked looks up, by business identity, the pending and
// processing rows no pelguard charge decided, whose charges may carry no
// metadata; then counts the charges without metadata that no row records.
func (r *run) lookUpUnmarked(ctx context.Context) error {
	rows, err := r.l.UnsettledRows(ctx)
	if err != nil {
		return err
	}
	looked := 0
	matched := map[string]bool{}
	for _, rec := range rows {
		if _, decided := r.marked[rec.Key]; decided || !(r.cfg.UnmarkedCharges || r.unmarkedBy[rec.StripeCustomerID]) {
			continue
		}
		if looked == 0 {
			r.progress("looking up pending and processing rows at Stripe by customer, amount and period")
		}
		looked++
		if err := r.lookUp(ctx, rec, matched); err != nil {
			return err
		}
	}
	if looked > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("looked up %d pending or processing rows at Stripe by customer, amount and period", looked))
	}
	return r.countUnrecorded(ctx, matched)
}

// lookUp decides one pending or processing row from FindCharge: one list
// call of its Stripe customer's charges.
func (r *run) lookUp(ctx context.Context, rec ledger.Record, matched map[string]bool) error {
	ev := event.Event{CustomerID: rec.CustomerID, StripeCustomerID: rec.StripeCustomerID, AmountCents: rec.AmountCents,
		BillingPeriod: rec.BillingPeriod, Currency: rec.Currency}
	ch, found, err := r.cfg.Stripe.FindCharge(ctx, stripeapi.ChargeQuery{
		StripeCustomerID: rec.StripeCustomerID, Since: lookupSince(rec), IdempotencyKey: rec.IdempotencyKey,
		CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, AmountCents: rec.AmountCents, Currency: rec.Currency,
		Description: r.cfg.Description(ev), ChargeIDs: []string{rec.ChargeID, rec.PaymentIntentID},
	})
	if err != nil {
		return fmt.Errorf("looking up %s at Stripe: %w", rec.Key, err)
	}
	if !found {
		return nil
	}
	matched[ch.ID] = true
	switch {
	case rec.Status == ledger.StatusProcessing && rec.ChargeID == ch.ID && ch.Status == "pending":
		return nil
	case !holds(ch):
		return r.refundedOnly(ctx, rec.Key, rec.IdempotencyKey, ch, rec, true)
	}
	attempt := 0 // unknown without pelguard's metadata: the row's stays
	if stripeapi.IsPelguard(ch.Metadata) {
		attempt = attemptOf(ch)
	}
	c := rebuilt(rec.Key, ch, rec.IdempotencyKey, attempt)
	if c.StripeCustomerID == "" {
		c.StripeCustomerID = rec.StripeCustomerID
	}
	res, err := r.l.Rebuild(ctx, c)
	if err != nil {
		return err
	}
	r.record(res, c)
	return nil
}

// lookupSince is how far back a look-up lists the customer's charges: the
// consumer's rule (consumer/process.go lookupSince): an hour before the
// first attempt, or the start of the billing period when earlier.
func lookupSince(rec ledger.Record) time.Time {
	since := rec.FirstAttemptAt.Add(-time.Hour)
	if start, err := time.Parse("2006-01", rec.BillingPeriod); err == nil && start.Before(since) {
		return start
	}
	return since
}

// countUnrecorded notes the charges without pelguard's metadata since
// Since that no ledger row records: which key one bills cannot be told
// from the charge alone, so none is guessed.
func (r *run) countUnrecorded(ctx context.Context, matched map[string]bool) error {
	n := 0
	for start := 0; start < len(r.unmarked); start += batch {
		part := r.unmarked[start:min(start+batch, len(r.unmarked))]
		recs, err := r.l.ByChargeIDs(ctx, part)
		if err != nil {
			return err
		}
		for _, id := range part {
			if _, ok := recs[id]; !ok && !matched[id] {
				n++
			}
		}
	}
	if n > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%d charges without pelguard's metadata since %s are in no ledger row: which key each bills "+
			"cannot be told from the charge alone; the consumers' look-ups rebuild them when their entries come back, "+
			"`"+cmdname.Consumer+" import --from-stripe` otherwise", n, r.since))
	}
	return nil
}
