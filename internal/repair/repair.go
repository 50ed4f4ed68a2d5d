// Package repair rebuilds pelguard's ledger from Stripe after the ledger
// lost commits: a Postgres failover to an asynchronous replica, or a
// restore from a backup (DESIGN.md "The ledger's own losses"). It reads
// Stripe's charges and refunds created since the loss, and never charges
// or refunds: every write is the ledger's (ledger.Rebuild and its
// siblings), under the same locks and fences as any ledger write, and
// idempotent, so two processes repairing at once, or a repair run twice,
// record everything once.
//
// What it rebuilds:
//   - pelguard's charges (their metadata names the key): a missing row is
//     inserted charged, or processing for a pending charge (a bank debit in
//     motion, never charged again); a row the failover took back to
//     pending or processing (or to a declined attempt the charge
//     succeeded after) now records the charge, under a new epoch;
//   - charges without pelguard's metadata (--charge-metadata=false): the
//     pending and processing rows are looked up by their business identity
//     (one list call per row); a missing row of such a charge cannot be
//     told from the charge alone and is left to the consumers' look-ups;
//   - refund_ledger from pelguard's refunds, so the rolling refund cap
//     counts every refund pelguard made;
//   - each touched period's spend-cap reservation, from its rows.
//
// A key whose only charges are fully refunded is not recorded as charged: it
// becomes a refunded_only finding for a person.
package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Config configures one repair.
type Config struct {
	Ledger *ledger.Ledger // required
	// Stripe reads charges and refunds (list, get); it never charges or
	// refunds. Required.
	Stripe *stripeapi.Client
	// Since: Stripe's charges and refunds created at or after it are read.
	// Required: where the ledger's loss may begin, with a margin.
	Since time.Time
	// Namespace is pelguard's idempotency-key namespace: a charge whose key
	// is of another namespace is another environment's. Required.
	Namespace string
	// By names who repairs (a process name), for the notes.
	By string
	// Description is the consumers' charge description (--description): the
	// look-up of charges without pelguard's metadata matches it. Default
	// "Usage billing for <period>", the consumer's.
	Description func(event.Event) string
	// UnmarkedCharges: the fleet charges without pelguard's metadata
	// (--charge-metadata=false), so every pending and processing row is
	// looked up at Stripe (FindCharge, one list call per row). Without it,
	// only the rows whose Stripe customer has a charge without the metadata
	// since Since are.
	UnmarkedCharges bool
	Logger          *slog.Logger // optional
	// Progress, if set, gets a line per phase and per 1,000 charges.
	Progress io.Writer
}

// Report is what a repair did.
type Report struct {
	// Rebuilt: rows the ledger lost, inserted again from Stripe.
	Rebuilt int
	// Repaired: pending or processing rows (or declined ones whose next
	// attempt succeeded) whose key has a charge at Stripe, brought in line.
	Repaired int
	// RefundsRebuilt: refund_ledger rows inserted again.
	RefundsRebuilt int
	// Findings: what it found and could not decide (a key whose only
	// charges are fully refunded, a row that records another charge, a
	// period whose charges exceed its cap). A rerun counts them again; it
	// records nothing twice.
	Findings int
	// Keys are the keys rebuilt or repaired.
	Keys []ledger.Key
	// RefundsUnread: the Stripe key may not read refunds (no Refunds read
	// permission), so refund_ledger was not rebuilt. pelguard refunds only
	// with a key that can (the auditor's): until a repair with such a key,
	// the rolling refund cap may miss refunds.
	RefundsUnread bool
	// Notes are human-readable lines (no secrets): a summary, and what was
	// found and left for a person.
	Notes []string
}

// maxDetailNotes bounds the per-key notes: a failover of thousands of keys
// is summarised, not listed.
const maxDetailNotes = 50

func (c *Config) validate() error {
	switch {
	case c.Ledger == nil:
		return errors.New("repair: a ledger is required")
	case c.Stripe == nil:
		return errors.New("repair: a Stripe client is required")
	case c.Since.IsZero():
		return errors.New("repair: Since is required (where the ledger's loss may begin)")
	case c.Namespace == "":
		return errors.New("repair: the idempotency-key namespace is required")
	}
	return nil
}

type run struct {
	cfg   Config
	log   *slog.Logger
	l     *ledger.Ledger
	rep   Report
	since string // Since, for the notes

	// marked holds pelguard's charges by key, unmarked the charges without
	// the metadata (succeeded or pending), unmarkedBy their Stripe customers.
	marked     map[ledger.Key][]stripeapi.Charge
	unmarked   []string
	unmarkedBy map[string]bool
	// periods are the periods whose caps are recounted; details counts the
	// per-key notes, omitted those beyond maxDetailNotes.
	periods map[string]bool
	details int
	omitted int
}

// Run repairs the ledger from Stripe. It returns what it did so far with
// an error (Stripe or Postgres failed): a rerun finishes the job and
// records nothing twice.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	cfg.By = cmp.Or(cfg.By, "repair")
	if cfg.Description == nil {
		cfg.Description = func(ev event.Event) string { return "Usage billing for " + ev.BillingPeriod }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &run{cfg: cfg, l: cfg.Ledger, log: cfg.Logger.With("by", cfg.By, "since", cfg.Since.UTC().Format(time.RFC3339)),
		since: cfg.Since.UTC().Format(time.RFC3339), marked: map[ledger.Key][]stripeapi.Charge{},
		unmarkedBy: map[string]bool{}, periods: map[string]bool{}}
	err := r.do(ctx)
	if r.omitted > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("… and %d more such lines (see the logs)", r.omitted))
	}
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%s repaired the ledger from Stripe's charges and refunds since %s: %d rows rebuilt, %d repaired, %d refunds rebuilt, %d findings",
		cfg.By, r.since, r.rep.Rebuilt, r.rep.Repaired, r.rep.RefundsRebuilt, r.rep.Findings))
	if err != nil {
		r.rep.Notes = append(r.rep.Notes, "the repair stopped early: "+err.Error())
		r.log.Warn("ledger repair stopped early", "error", err)
		return r.rep, err
	}
	r.log.Info("ledger repaired from Stripe", "rebuilt", r.rep.Rebuilt, "repaired", r.rep.Repaired,
		"refunds_rebuilt", r.rep.RefundsRebuilt, "findings", r.rep.Findings)
	return r.rep, nil
}

func (r *run) do(ctx context.Context) error {
	// Refunds first: a charge pelguard refunded as a duplicate is never a
	// key's charge, and the rebuilt refund_ledger is what says so.
	if err := r.refunds(ctx); err != nil {
		return err
	}
	if err := r.listCharges(ctx); err != nil {
		return err
	}
	if err := r.decideMarked(ctx); err != nil {
		return err
	}
	if err := r.lookUpUnmarked(ctx); err != nil {
		return err
	}
	return r.recountCaps(ctx)
}

func (r *run) progress(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "repair: "+format+"\n", args...)
	}
}

// note adds a line about one key (bounded by maxDetailNotes) and logs it.
func (r *run) note(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	r.log.Info(line)
	if r.details++; r.details > maxDetailNotes {
		r.omitted++
		return
	}
	r.rep.Notes = append(r.rep.Notes, line)
}

// until is the listings' upper bound: no real bound (a month past now
// also covers a host clock behind Stripe's).
func (r *run) until() time.Time {
	now := r.l.Now()
	if r.cfg.Since.After(now) {
		now = r.cfg.Since
	}
	return now.AddDate(0, 1, 0)
}

// refunds rebuilds refund_ledger from pelguard's refunds since Since.
func (r *run) refunds(ctx context.Context) error {
	r.progress("reading refunds since %s", r.since)
	n, listed, mine, err := rebuildRefunds(ctx, r.l, r.cfg.Stripe, r.cfg.Since, r.until())
	if errors.Is(err, stripeapi.ErrPermission) {
		r.rep.RefundsUnread = true
		r.rep.Notes = append(r.rep.Notes, "refunds not read: the Stripe key has no Refunds read permission; refund_ledger was not rebuilt "+
			"(a repair with the auditor's key rebuilds it)")
		r.log.Warn("ledger repair cannot read refunds: refund_ledger not rebuilt", "error", err)
		return nil
	}
	if err != nil {
		return err
	}
	r.rep.RefundsRebuilt = n
	r.progress("listed %d refunds, %d of them pelguard's; %d were not in refund_ledger", listed, mine, n)
	return nil
}

// RebuildRefunds records again in refund_ledger pelguard's refunds created
// in [from, to) that it lacks, and returns how many: the rolling refund cap
// then counts every refund Stripe made for pelguard, whatever the ledger
// lost. The auditor runs it over the last 24 h before each refund run. It
// needs the key's Refunds read permission (stripeapi.ErrPermission).
func RebuildRefunds(ctx context.Context, l *ledger.Ledger, sc *stripeapi.Client, from, to time.Time) (int, error) {
	n, _, _, err := rebuildRefunds(ctx, l, sc, from, to)
	return n, err
}

func rebuildRefunds(ctx context.Context, l *ledger.Ledger, sc *stripeapi.Client, from, to time.Time) (rebuilt, listed, mine int, err error) {
	var found []ledger.RebuiltRefund
	err = sc.ListRefunds(ctx, from, to, func(re stripeapi.Refund) error {
		listed++
		if !stripeapi.IsPelguardRefund(re.Metadata) || re.ChargeID == "" {
			return nil
		}
		found = append(found, ledger.RebuiltRefund{RefundID: re.ID, ChargeID: re.ChargeID, AmountCents: re.AmountCents,
			Currency: strings.ToLower(re.Currency), Created: re.Created,
			CustomerID: re.Metadata[stripeapi.MetaCustomerID], BillingPeriod: re.Metadata[stripeapi.MetaBillingPeriod]})
		return nil
	})
	if err != nil {
		return 0, listed, len(found), err
	}
	rebuilt, err = l.RebuildRefunds(ctx, found)
	return rebuilt, listed, len(found), err
}

// listCharges files every charge since Since: pelguard's by key, the
// others by Stripe customer.
func (r *run) listCharges(ctx context.Context) error {
	r.progress("reading charges since %s", r.since)
	var listed, otherNS, keyless int
	err := r.cfg.Stripe.ListCharges(ctx, r.cfg.Since, r.until(), func(ch stripeapi.Charge) error {
		listed++
		if listed%1000 == 0 {
			r.progress("listed %d charges", listed)
		}
		live := ch.Status == "succeeded" || ch.Status == "pending"
		if !stripeapi.IsPelguard(ch.Metadata) {
			if live {
				r.unmarked = append(r.unmarked, ch.ID)
				r.unmarkedBy[ch.StripeCustomerID] = true
			}
			return nil
		}
		md := ch.Metadata
		k := ledger.Key{CustomerID: md[stripeapi.MetaCustomerID], BillingPeriod: md[stripeapi.MetaBillingPeriod]}
		switch {
		case k.CustomerID == "" || k.BillingPeriod == "" || ch.StripeCustomerID == "":
			keyless++
		case md[stripeapi.MetaIdempotencyKey] != event.IdempotencyKey(k.CustomerID, k.BillingPeriod, r.cfg.Namespace):
			otherNS++
		default:
			r.marked[k] = append(r.marked[k], ch)
			r.periods[k.BillingPeriod] = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.progress("listed %d charges: %d keys of pelguard's, %d charges without its metadata", listed, len(r.marked), len(r.unmarked))
	if otherNS > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%d of pelguard's charges since %s are of another namespace than %q: another environment's, left alone",
			otherNS, r.since, r.cfg.Namespace))
	}
	if keyless > 0 {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("%d charges since %s carry pelguard's marker but no customer, period or Stripe customer: the auditor reports them (orphan_charge)",
			keyless, r.since))
	}
	return nil
}

// sortedKeys returns the marked keys in a stable order.
func (r *run) sortedKeys() []ledger.Key {
	keys := make([]ledger.Key, 0, len(r.marked))
	for k := range r.marked {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b ledger.Key) int { return strings.Compare(a.String(), b.String()) })
	return keys
}

// record applies one Rebuild result to the report.
func (r *run) record(res ledger.RebuildResult, c ledger.RebuiltCharge) {
	switch res.Outcome {
	case ledger.RebuildInserted:
		r.rep.Rebuilt++
		r.rep.Keys = append(r.rep.Keys, c.Key)
		r.log.Info("ledger row rebuilt from Stripe", "key", c.Key.String(), "charge_id", c.ChargeID, "status", string(res.Record.Status))
	case ledger.RebuildRepaired:
		r.rep.Repaired++
		r.rep.Keys = append(r.rep.Keys, c.Key)
		r.log.Info("ledger row repaired from Stripe", "key", c.Key.String(), "charge_id", c.ChargeID,
			"was", string(res.Before.Status), "now", string(res.Record.Status))
	case ledger.RebuildConflict:
		r.rep.Findings++
		r.note("%s: %s", c.Key, res.Detail)
	case ledger.RebuildRefunded:
		r.note("%s: %s", c.Key, res.Detail)
	}
	r.periods[c.BillingPeriod] = true
}

// recountCaps makes every touched period's reservation what its rows
// reserve.
func (r *run) recountCaps(ctx context.Context) error {
	periods := make([]string, 0, len(r.periods))
	for p := range r.periods {
		periods = append(periods, p)
	}
	slices.Sort(periods)
	r.progress("recounting the spend caps of %d periods", len(periods))
	rcs, err := r.l.RecountCaps(ctx, periods)
	if err != nil {
		return err
	}
	for _, rc := range rcs {
		if rc.Before != rc.ReservedCents {
			r.log.Info("spend cap reservation recounted", "period", rc.BillingPeriod, "before", rc.Before, "now", rc.ReservedCents)
		}
		if rc.Over() {
			r.rep.Findings++
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("period %s: its charges exceed its spend cap (its rows reserve %d cents, the cap is %d): "+
				"the money was already taken; the cap holds it in full and charges nothing more of the period until it is raised",
				rc.BillingPeriod, rc.RowsCents, rc.CapCents))
		}
	}
	return nil
}
