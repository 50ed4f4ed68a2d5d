package reaper

// The external-ledger mode: a team keeps its own consumer (the article's,
// or one like it: content-hash key, pre-flight SELECT on its own table,
// INSERT … ON CONFLICT DO NOTHING, XACK, no heartbeat) and replaces only
// its XAUTOCLAIM "stuck message" monitor with this reaper.
//
//   - Decisions read the team's table: a row with a charge or a terminal
//     status → already_billed, ack, no Stripe call; no row → claim, but only
//     once idle longer than MinIdle, which must be at least twice the team
//     consumer's worst-case Stripe call (ExternalMaxCall). That margin is the
//     only guard against "reclaim while in flight" here: the team's
//     consumers never heartbeat nor register, so liveness does not apply.
//   - A re-drive takes a lease row of its own (pelguard's schema,
//     external_leases) so two reapers never drive one key, asks Stripe
//     first (invariant 9), charges exactly as the team's consumer does when
//     nothing is found, writes the team's table as the team does, and acks
//     only after that commit.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Statuses of the team's table: the article's consumer writes these two.
const (
	teamCharged  = "charged"
	teamDeclined = "card_declined"
)

// externalTerminal are the team statuses that end an event without a
// charge id: nothing is ever charged again for them.
var externalTerminal = map[ledger.Status]bool{
	teamCharged: true, teamDeclined: true, "declined": true, "failed": true, "refunded": true,
}

// externalBilled reports whether the team's row settles the event.
func externalBilled(rec ledger.Record) bool {
	return rec.ChargeID != "" || externalTerminal[rec.Status]
}

// validateExternal checks the external-ledger settings.
func (c *Config) validateExternal() error {
	if c.ExternalLedger == "" {
		if c.ExternalMaxCall != 0 {
			return errors.New("reaper: --external-max-call applies only with --external-ledger")
		}
		return nil
	}
	if c.ExternalInsert != "" && !strings.Contains(c.ExternalInsert, "$1") {
		return errors.New("reaper: --external-insert must be an INSERT with parameters $1..$6 (customer_id, billing_period, charge_id, amount_cents, status, error)")
	}
	if _, err := parseTeamTable(c.ExternalLedger); err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if c.ExternalMaxCall <= 0 {
		return errors.New("reaper: --external-ledger needs --external-max-call: the team consumer's worst-case Stripe call (its client timeout × attempts)")
	}
	if c.MinIdle < 2*c.ExternalMaxCall {
		return fmt.Errorf("reaper: --min-idle %s is below 2 × --external-max-call %s (= %s): the team's consumers have no heartbeat, "+
			"so an entry idle less than that may still be inside its Stripe call; raise --min-idle to at least %s",
			c.MinIdle, c.ExternalMaxCall, 2*c.ExternalMaxCall, 2*c.ExternalMaxCall)
	}
	return nil
}

// lookupRows reads the rows decisions depend on: the team's table in the
// external-ledger mode, pelguard's ledger otherwise.
func (r *Reaper) lookupRows(ctx context.Context, keys []ledger.Key) (map[ledger.Key]ledger.Record, error) {
	if r.team != nil {
		return r.team.lookup(ctx, r.cfg.DB, keys)
	}
	return r.ledger.Lookup(ctx, keys)
}

// externalLease is the lease row a re-drive holds.
type externalLease struct {
	key      ledger.Key
	epoch    int64
	reserved int64
}

// errLeaseBusy: another reaper holds the key's lease.
var errLeaseBusy = errors.New("another reaper holds the key's external lease")

// takeLease takes (or takes over, once expired) the key's lease, reserves
// the spend cap for it, and re-reads the team's row, in one transaction.
// billed is true when the team's table settles the event after all: the
// lease is then not kept.
func (r *Reaper) takeLease(ctx context.Context, stream, id string, ev event.Event) (l externalLease, billed bool, err error) {
	k := ledger.EventKey(ev)
	l.key = k
	now := r.cfg.Clock.Now()
	lease := max(r.cfg.Lease, r.cfg.MinIdle)
	tx, err := r.ledger.DB().Begin(ctx)
	if err != nil {
		return l, false, fmt.Errorf("taking the external lease of %s: %w", k, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = tx.QueryRow(ctx, `
		INSERT INTO {schema}.external_leases (customer_id, billing_period, owner, stream, message_id, expires_at, created_at, updated_at, epoch)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $7, `+ledger.EpochFloorSQL+` + 1)
		ON CONFLICT (customer_id, billing_period) DO UPDATE SET owner = EXCLUDED.owner, epoch = greatest({schema}.external_leases.epoch, `+ledger.EpochFloorSQL+`) + 1,
			stream = EXCLUDED.stream, message_id = EXCLUDED.message_id, expires_at = EXCLUDED.expires_at,
			updated_at = EXCLUDED.updated_at
		WHERE {schema}.external_leases.expires_at <= $7
		RETURNING epoch, cap_reserved_cents`,
		k.CustomerID, k.BillingPeriod, r.cfg.Name, stream, id, now.Add(lease), now).Scan(&l.epoch, &l.reserved)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, errLeaseBusy
	}
	if err != nil {
		return l, false, fmt.Errorf("taking the external lease of %s: %w", k, err)
	}
	rows, err := r.team.lookup(ctx, tx, []ledger.Key{k})
	if err != nil {
		return l, false, err
	}
	if rec, ok := rows[k]; ok && externalBilled(rec) {
		if err := r.dropLease(ctx, tx, l); err != nil {
			return l, false, err
		}
		return l, true, tx.Commit(ctx)
	}
	if l.reserved == 0 {
		// A lease taken over from a crashed reaper keeps its reservation.
		if l.reserved, err = ledger.ReserveCap(ctx, tx, k.BillingPeriod, ev.AmountCents, r.cfg.RequireCap); err != nil {
			return l, false, err
		}
		if _, err := tx.Exec(ctx, `UPDATE {schema}.external_leases SET cap_reserved_cents = $3
			WHERE customer_id = $1 AND billing_period = $2`, k.CustomerID, k.BillingPeriod, l.reserved); err != nil {
			return l, false, fmt.Errorf("recording the cap reservation of %s: %w", k, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return l, false, fmt.Errorf("taking the external lease of %s: %w", k, err)
	}
	return l, false, nil
}

// dropLease deletes our lease row (fenced by epoch) and gives back its
// reservation.
func (r *Reaper) dropLease(ctx context.Context, tx pgx.Tx, l externalLease) error {
	tag, err := tx.Exec(ctx, `DELETE FROM {schema}.external_leases
		WHERE customer_id = $1 AND billing_period = $2 AND owner = $3 AND epoch = $4`,
		l.key.CustomerID, l.key.BillingPeriod, r.cfg.Name, l.epoch)
	if err != nil {
		return fmt.Errorf("releasing the external lease of %s: %w", l.key, err)
	}
	if tag.RowsAffected() == 1 {
		return ledger.ReleaseCap(ctx, tx, l.key.BillingPeriod, l.reserved)
	}
	return nil
}

// release gives the lease up after a re-drive that charged nothing.
func (r *Reaper) release(ctx context.Context, l externalLease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return pgx.BeginFunc(ctx, r.ledger.DB(), func(tx pgx.Tx) error { return r.dropLease(ctx, tx, l) })
}

// finishExternal writes the team's row and removes our lease in one
// transaction. A charge keeps its cap reservation (it is spent); a decline
// gives it back.
func (r *Reaper) finishExternal(ctx context.Context, l externalLease, ev event.Event, chargeID, status, errText string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return pgx.BeginFunc(ctx, r.ledger.DB(), func(tx pgx.Tx) error {
		if err := r.team.insert(ctx, tx, l.key, chargeID, ev.AmountCents, status, errText); err != nil {
			return err
		}
		if status == teamDeclined {
			return r.dropLease(ctx, tx, l)
		}
		_, err := tx.Exec(ctx, `DELETE FROM {schema}.external_leases
			WHERE customer_id = $1 AND billing_period = $2 AND owner = $3 AND epoch = $4`,
			l.key.CustomerID, l.key.BillingPeriod, r.cfg.Name, l.epoch)
		return err
	})
}

// periodStart is where the look-up starts listing the customer's charges:
// the start of the billing period, or 62 days back for another format.
func periodStart(period string, now time.Time) time.Time {
	if t, err := time.Parse("2006-01", period); err == nil {
		return t
	}
	return now.Add(-62 * 24 * time.Hour)
}

// externalRedrive handles one claimed entry in the external-ledger mode.
func (r *Reaper) externalRedrive(ctx context.Context, st *streamState, msg redis.XMessage) (consumer.Outcome, error) {
	ev, err := event.ParseFields(msg.Values, r.cfg.Rules)
	if err != nil {
		return consumer.OutcomeRetryLater, fmt.Errorf("parsing %s: %w", msg.ID, err) // decided valid; cannot happen
	}
	log := r.cfg.Logger.With(slog.String("stream", st.Stream), slog.String("id", msg.ID),
		slog.String("customer_id", ev.CustomerID), slog.String("billing_period", ev.BillingPeriod))
	l, billed, err := r.takeLease(ctx, st.Stream, msg.ID, ev)
	var capErr *ledger.CapError
	switch {
	case errors.Is(err, errLeaseBusy):
		return consumer.OutcomeBusy, nil
	case errors.As(err, &capErr), errors.Is(err, ledger.ErrNoCap):
		reason := consumer.ReasonSpendCap
		if capErr != nil {
			consumer.NotifyCapOnce(ctx, r.cfg.Redis, r.cfg.Notifier, r.cfg.Schema, r.cfg.Namespace,
				alerts.SpendCapReached(ev.BillingPeriod, capErr.CapCents, capErr.ReservedCents, capErr.RequestedCents, ev.CustomerID))
		} else {
			reason = consumer.ReasonNoSpendCap
		}
		errs := consumer.DeadLetterMany(ctx, r.cfg.Redis, st.Stream, st.Group, r.cfg.Name,
			[]consumer.Dead{{Msg: msg, Reason: reason, Detail: err.Error()}}, r.cfg.Clock.Now())
		return consumer.OutcomeSpendCap, errs[0]
	case err != nil:
		return consumer.OutcomeRetryLater, err
	case billed:
		return consumer.OutcomeAlreadyBilled, r.ackExternal(ctx, st, msg.ID)
	}

	key := ev.Key(r.cfg.Namespace)
	desc := "Usage billing for " + ev.BillingPeriod
	if r.cfg.Description != nil {
		desc = r.cfg.Description(ev)
	}
	// Ask Stripe first, always: the team's consumer may have charged and
	// died before its INSERT, more than 24 h ago (the key forgotten), or a
	// re-published event's first copy was charged under another stream id.
	found, ok, err := r.cfg.Stripe.FindCharge(ctx, stripeapi.ChargeQuery{
		StripeCustomerID: ev.StripeCustomerID, Since: periodStart(ev.BillingPeriod, r.cfg.Clock.Now()), IdempotencyKey: key,
		CustomerID: ev.CustomerID, BillingPeriod: ev.BillingPeriod, AmountCents: ev.AmountCents, Currency: ev.Currency,
		Description: desc,
	})
	if err != nil {
		r.cfg.Notifier.Notify(alerts.StripeLookupFailed(ev.CustomerID, ev.BillingPeriod, err.Error()))
		return consumer.OutcomeRetryLater, errors.Join(fmt.Errorf("looking up an earlier charge: %w", err), r.release(ctx, l))
	}
	chargeID, status, errText := found.ID, teamCharged, ""
	if ok {
		log.InfoContext(ctx, "found the team's charge at Stripe; recording it, not charging", slog.String("charge_id", found.ID))
	} else {
		// Exactly the team's request: its key, its description, no metadata.
		ch, err := r.cfg.Stripe.Charge(ctx, stripeapi.ChargeRequest{
			IdempotencyKey: key, StripeCustomerID: ev.StripeCustomerID, AmountCents: ev.AmountCents,
			Currency: ev.Currency, Description: desc,
		})
		switch {
		case err == nil:
			chargeID = ch.ID
		case errors.Is(err, stripeapi.ErrCardDeclined):
			// Recorded as the team does; never retried under a new key here:
			// the team's consumer owns its keys.
			chargeID, status, errText = "", teamDeclined, err.Error()
		case errors.Is(err, stripeapi.ErrTransient):
			return consumer.OutcomeRetryLater, errors.Join(fmt.Errorf("stripe: %w", err), r.release(ctx, l))
		default:
			r.cfg.Notifier.Notify(alerts.ChargeFailed(ev.CustomerID, ev.BillingPeriod, err.Error()))
			return consumer.OutcomeRetryLater, errors.Join(fmt.Errorf("stripe: %w", err), r.release(ctx, l))
		}
	}
	if err := r.finishExternal(ctx, l, ev, chargeID, status, errText); err != nil {
		// Charged (or declined) but not recorded: the lease expires and the
		// next taker finds the charge at Stripe.
		return consumer.OutcomeRetryLater, err
	}
	out := consumer.OutcomeCharged
	if status == teamDeclined {
		out = consumer.OutcomeDeclined
	}
	return out, r.ackExternal(ctx, st, msg.ID)
}

func (r *Reaper) ackExternal(ctx context.Context, st *streamState, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.cfg.Redis.XAck(ctx, st.Stream, st.Group, id).Err(); err != nil {
		return fmt.Errorf("XACK %s: %w", id, err)
	}
	return nil
}
