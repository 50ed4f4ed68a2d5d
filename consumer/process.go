package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

// Outcome is how the handling of one stream entry ended.
type Outcome string

// Outcomes. Every one but Busy, RetryLater and LeaseLost ends with XACK.
const (
	OutcomeCharged       Outcome = "charged"        // new ledger row charged (or a lost charge found at Stripe)
	OutcomeAlreadyBilled Outcome = "already_billed" // ledger terminal: acked without a Stripe call
	OutcomeDeclined      Outcome = "declined"
	OutcomeFailed        Outcome = "failed"      // permanent Stripe error: ledger failed + dead letter
	OutcomeDeadLetter    Outcome = "dead_letter" // invalid or conflicting event
	OutcomeSpendCap      Outcome = "spend_cap"   // the cap forbids it: dead letter, no charge
	OutcomeBusy          Outcome = "busy"        // another holder's live lease: left pending
	OutcomeRetryLater    Outcome = "retry_later" // transient failure: left pending, lease released
	OutcomeLeaseLost     Outcome = "lease_lost"  // our PEL entry or lease went to someone else
	// OutcomeProcessing: money in motion (a bank debit's pending charge):
	// the ledger follows it until Stripe says it is final.
	OutcomeProcessing Outcome = "processing"
	// OutcomeActionRequired: Stripe needs the customer; ledger
	// action_required + dead letter: replay it once fixed.
	OutcomeActionRequired Outcome = "action_required"

	// The meter consumer's own outcomes (consumer/meter.go); it uses
	// AlreadyBilled (delivered before: acked without a call), Failed
	// (Stripe refused it for good), DeadLetter, SpendCap (it would pass
	// its customer's meter cap for the month: dead letter, not sent),
	// Busy and RetryLater as above.

	// OutcomeDelivered: Stripe counted the meter event (or refused its
	// identifier as one it already has); recorded delivered, acked.
	OutcomeDelivered Outcome = "delivered"
	// OutcomeParked: the event's outcome is unknown and Stripe may no
	// longer recognise its identifier: not sent again; dead letter + alert.
	OutcomeParked Outcome = "parked"
)

// Acked reports whether the entry was acknowledged.
func (o Outcome) Acked() bool {
	return o != OutcomeBusy && o != OutcomeRetryLater && o != OutcomeLeaseLost
}

// Stripe is what the consumer needs of the Stripe adapter (*stripeapi.Client).
type Stripe interface {
	Charge(ctx context.Context, req stripeapi.ChargeRequest) (stripeapi.Charge, error)
	FindCharge(ctx context.Context, q stripeapi.ChargeQuery) (stripeapi.Charge, bool, error)
	// GetCharge reads a processing row's pending charge (polling).
	GetCharge(ctx context.Context, id string) (stripeapi.Charge, error)
	// GetIntent and CancelIntent close an earlier attempt's intent before
	// the next attempt is made.
	GetIntent(ctx context.Context, id string) (stripeapi.Intent, error)
	CancelIntent(ctx context.Context, id, idempotencyKey string) (stripeapi.Intent, error)
}

// Dead-letter reasons besides event.Reason*.
const (
	ReasonSpendCap    = "spend_cap"
	ReasonNoSpendCap  = "no_spend_cap"
	ReasonConflict    = "conflicting_event"
	ReasonStripePerm  = "stripe_permanent_error"
	ReasonStripeKey   = "stripe_key_error" // 401/403: row left pending; replay once the key is fixed
	ReasonMaxDelivery = "max_deliveries"
	// ReasonActionRequired: Stripe needs the customer (authentication, a
	// payment method); replaying it charges again under a new attempt's key.
	ReasonActionRequired = "action_required"
)

// Processor handles single stream entries: the per-event algorithm of
// DESIGN.md, shared by the consumer's workers and the reaper's re-drive.
type Processor struct {
	cfg    Config
	tracer trace.Tracer
	hb     *heartbeat
	// settler records and acks the consumer's charged outcomes in groups
	// (commit.go); nil (the reaper's processor): one by one.
	settler *settler
}

// Process handles one entry read or claimed by this processor's consumer
// name, from validation to ack. It never returns an error for a bad event or
// a Stripe failure: those are outcomes. err is set only when the outcome is
// RetryLater because a dependency (Redis, Postgres) failed.
func (p *Processor) Process(ctx context.Context, stream string, msg redis.XMessage) (Outcome, error) {
	h := p.hb.add(ctx, stream, msg.ID)
	defer p.hb.remove(h)
	return p.processPrepared(h, msg, nil, time.Time{}, nil)
}

// outcomeSettling: the charge was handed to the settler, which ends the
// event (records, acks, counts) with its real outcome. Never reported.
const outcomeSettling Outcome = "settling"

// processPrepared handles one held entry, with what the reader already did
// for it, if anything (pre: the parsed event and the batch reservation's
// decision): then the per-event Reserve is skipped, everything else is the
// same. readAt, if set, is when the reader got the entry: the event's span
// starts there. after, if set, runs once the event has ended: when this
// returns, or, for a charge handed to the consumer's settler (then this
// returns outcomeSettling), once its group is recorded and acked.
func (p *Processor) processPrepared(h *hold, msg redis.XMessage, pre *prepared, readAt time.Time, after func()) (out Outcome, err error) {
	ctx, span := p.startEvent(h, msg.ID, readAt)
	log := p.cfg.Logger.With(slog.String("stream", h.stream), slog.String("id", msg.ID))
	end := func(out Outcome, err error) {
		endEvent(span, out, err)
		p.cfg.Metrics.event(h.stream, out)
		p.hb.events.Add(1)
		if err != nil {
			log.WarnContext(ctx, "event left pending", slog.String("outcome", string(out)), slog.Any("error", err))
		} else {
			log.DebugContext(ctx, "event handled", slog.String("outcome", string(out)))
		}
		if after != nil {
			after()
		}
	}
	if p.settler != nil && after != nil {
		h.settled = end // apply may hand a charge over
	}
	defer func() {
		if out != outcomeSettling {
			end(out, err)
		}
	}()

	if msg.Values == nil { // XREADGROUP 0 returns deleted entries with no body
		return OutcomeAlreadyBilled, p.ack(ctx, h.stream, msg.ID)
	}
	var ev event.Event
	if pre != nil {
		ev = pre.ev // parsed by the reader
	} else if ev, err = event.ParseFields(msg.Values, p.cfg.Rules); err != nil {
		var re *event.RejectError
		errors.As(err, &re)
		return p.deadLetter(ctx, h.stream, msg, re.Reason, re.Error(), OutcomeDeadLetter, false)
	}
	log = log.With(slog.String("customer_id", ev.CustomerID), slog.String("billing_period", ev.BillingPeriod))
	span.SetAttributes(attrCustomerID.String(ev.CustomerID), attrBillingPeriod.String(ev.BillingPeriod))

	var claim ledger.Claim
	if pre != nil && pre.batch.Decided {
		// The reader's batch reservation decided it, as Reserve would.
		claim, err = pre.batch.Claim, pre.batch.Err
	} else {
		req := p.reserveRequest(ev, msg.ID)
		req.Replay = IsReplay(msg.Values)
		claim, err = p.cfg.ledger.Reserve(ctx, req)
	}
	var capErr *ledger.CapError
	switch {
	case errors.As(err, &capErr):
		NotifyCapOnce(ctx, p.cfg.Redis, p.cfg.Notifier, p.cfg.Schema, p.cfg.Namespace,
			alerts.SpendCapReached(ev.BillingPeriod, capErr.CapCents, capErr.ReservedCents, capErr.RequestedCents, ev.CustomerID))
		return p.deadLetter(ctx, h.stream, msg, ReasonSpendCap, capErr.Error(), OutcomeSpendCap, true)
	case errors.Is(err, ledger.ErrNoCap):
		return p.deadLetter(ctx, h.stream, msg, ReasonNoSpendCap,
			"no spend cap for "+ev.BillingPeriod+" and --require-cap is set; set one with `"+cmdname.Consumer+" cap set`", OutcomeSpendCap, false)
	case err != nil:
		return p.leftPending(ctx, OutcomeRetryLater, fmt.Errorf("reserving: %w", err))
	}

	span.AddEvent("ledger.reserved", trace.WithAttributes(attrDecision.String(claim.Decision.String())))
	switch claim.Decision {
	case ledger.AlreadyTerminal:
		// Partial batch / AOF rollback / killed before XACK: the ledger says
		// it is done, so this delivery is acked without a Stripe call.
		return OutcomeAlreadyBilled, p.ack(ctx, h.stream, msg.ID)
	case ledger.Busy:
		// Reclaim while in flight: someone else holds a live lease. Leave the
		// entry; once they finish, the reaper acks it from the ledger.
		return OutcomeBusy, nil
	case ledger.Conflict:
		return p.deadLetter(ctx, h.stream, msg, ReasonConflict, conflictDetail(claim.Record, ev, p.cfg.Namespace), OutcomeDeadLetter, false)
	}

	rec := claim.Record
	h.setLease(&rec)
	return p.charge(ctx, h, msg, ev, rec, log)
}

func (p *Processor) reserveRequest(ev event.Event, msgID string) ledger.ReserveRequest {
	return ledger.ReserveRequest{
		Event: ev, IdempotencyKey: ev.Key(p.cfg.Namespace), Owner: p.cfg.Name, Lease: p.cfg.Lease,
		MessageID: msgID, RequireCap: p.cfg.RequireCap,
	}
}

// IsReplay reports whether a stream entry's fields are a dead letter put
// back by ReplayDeadLetters: the runbook's "fix, then replay", which
// charges a reopenable row (failed, action_required) again.
func IsReplay(fields map[string]any) bool {
	_, ok := fields[ReplayedFromField]
	return ok
}

// charge makes (or finds) the Stripe charge for a row whose lease we hold,
// records the outcome, then acks.
// ctx is h.ctx with the event's span.
func (p *Processor) charge(ctx context.Context, h *hold, msg redis.XMessage, ev event.Event, rec ledger.Record, log *slog.Logger) (Outcome, error) {
	now := p.cfg.Clock.Now()

	// Past the safe window Stripe may have forgotten the key, and in a
	// period with imported history a charge may exist that pelguard did not
	// make: look before charging; if the lookup fails, leave it pending and
	// say so.
	imported, err := p.cfg.ledger.HasImportedHistory(ctx, rec.BillingPeriod)
	if err != nil {
		return p.release(ctx, rec, OutcomeRetryLater, err)
	}
	if res, done, err := p.closePreviousAttempt(ctx, h, rec, log); done {
		return res, err
	}
	if imported || p.cfg.Witness.Suspect() || claimPastWindow(rec, now, p.cfg.SafeKeyWindow) ||
		(rec.Attempt == 1 && eventPastWindow(ev, h.id, now, p.cfg.SafeKeyWindow)) {
		start := time.Now()
		ch, ok, err := p.findCharge(ctx, p.chargeQuery(ev, rec))
		p.cfg.Metrics.stripeCall(resultClass(err), time.Since(start).Seconds())
		if err != nil {
			p.cfg.Notifier.Notify(alerts.StripeLookupFailed(ev.CustomerID, ev.BillingPeriod, err.Error()))
			return p.release(ctx, rec, OutcomeRetryLater, fmt.Errorf("looking up an earlier charge past the key window: %w", err))
		}
		if ok {
			if res, done, err := p.foundElsewhere(ctx, rec, ev, ch); done {
				return res, err
			}
			v := found(ch, now)
			v.Note = "found the charge of an earlier attempt at Stripe: " + ch.ID
			return p.apply(ctx, h, msg, rec, v, log)
		}
	}

	// Re-check, just before the call, that the entry is still ours: the
	// heartbeat ticks only every lease/3.
	owned, err := p.hb.stillOwned(ctx, h)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (cause: %v)", err, context.Cause(ctx))
	}
	if err != nil {
		return p.release(ctx, rec, OutcomeRetryLater, fmt.Errorf("checking ownership before the Stripe call: %w", err))
	}
	if !owned || ctx.Err() != nil {
		return p.release(ctx, rec, OutcomeLeaseLost, nil)
	}

	start := time.Now()
	req := stripeapi.ChargeRequest{
		IdempotencyKey:   p.attemptKey(rec),
		StripeCustomerID: rec.StripeCustomerID,
		AmountCents:      rec.AmountCents,
		Currency:         rec.Currency,
		Description:      p.cfg.Description(ev),
		Metadata:         stripeapi.PelguardMetadata(rec.CustomerID, rec.BillingPeriod, rec.IdempotencyKey),
	}
	if rec.Attempt > 1 {
		req.Metadata[stripeapi.MetaAttempt] = strconv.Itoa(rec.Attempt)
	}
	if p.cfg.OmitChargeMetadata {
		req.Metadata = nil
	}
	ch, err := p.stripeCharge(ctx, req)
	p.cfg.Metrics.stripeCall(resultClass(err), time.Since(start).Seconds())
	if p.cfg.Test.AfterStripeReply != nil {
		p.cfg.Test.AfterStripeReply()
	}
	v := decideCharge(rec, chargeResult{Charge: ch, Err: err, LeaseLost: errors.Is(context.Cause(ctx), errLeaseLost)},
		p.cfg.Retry, p.cfg.Clock.Now())
	if v.Ledger == lookUp {
		found, ok, lerr := p.findCharge(ctx, p.chargeQuery(ev, rec))
		if lerr == nil && ok {
			if res, done, err := p.foundElsewhere(ctx, rec, ev, found); done {
				return res, err
			}
		}
		v = decideMismatch(rec, found, ok, lerr, v.Cause, p.cfg.Clock.Now())
	}
	return p.apply(ctx, h, msg, rec, v, log)
}

// apply does what a verdict says, in the order invariant 3 wants: the
// ledger step (fenced: a holder that lost its lease writes nothing and
// acks nothing), then the alert, then the ack or the dead letter. A
// ledger-driven row out of takeovers is parked instead of released
// (parkInstead). ctx is the event's.
func (p *Processor) apply(ctx context.Context, h *hold, msg redis.XMessage, rec ledger.Record, v verdict, log *slog.Logger) (Outcome, error) {
	v = parkInstead(rec, h.stream == "" && rec.StreamMessageID == ledger.LedgerDriven, v)
	if v.Note != "" {
		log.InfoContext(ctx, v.Note)
	}
	switch v.Ledger {
	case writeOutcome:
		if v.Record.ChargeID != "" {
			trace.SpanFromContext(ctx).SetAttributes(attrChargeID.String(v.Record.ChargeID))
		}
		if h.settled != nil && v.Stream == ackEntry && v.Alert == nil && v.Record.Status == ledger.StatusCharged {
			// The consumer's hot path: recorded, witnessed and acked with
			// the other charges of its group (commit.go), in this order.
			p.settler.submit(settleReq{ctx: ctx, h: h, rec: rec, chargeID: v.Record.ChargeID, done: h.settled})
			return outcomeSettling, nil
		}
		// A charge may have been made: record it even if the lease is
		// being lost (finishOnly detaches).
		if res, err := p.finishOnly(ctx, rec, v.Record); err != nil || res == OutcomeLeaseLost {
			// Not recorded by us: no ack (invariant 3). The entry stays
			// pending and the next delivery finds whatever the new holder
			// recorded.
			return res, err
		}
	case releaseLease:
		p.releaseQuiet(ctx, rec, v.Cause)
	case parkRow:
		p.park(ctx, rec, v.Cause, log)
	}
	if v.Alert != nil {
		p.cfg.Notifier.Notify(*v.Alert)
	}
	switch v.Stream {
	case ackEntry:
		return v.Outcome, p.ack(ctx, h.stream, h.id)
	case deadLetterEntry:
		return p.deadLetter(ctx, h.stream, msg, v.Reason, v.Detail, v.Outcome, v.Alert != nil)
	}
	return v.Outcome, v.Cause
}

// park stops the ledger's retries of a row out of takeovers (parkInstead),
// logging (not returning) a failure: the row stays released and TakeDue
// takes it again later, when it is parked at its release.
func (p *Processor) park(ctx context.Context, rec ledger.Record, cause error, log *slog.Logger) {
	ctx, cancel := detach(ctx)
	defer cancel()
	if _, err := p.cfg.ledger.Park(ctx, rec, cause.Error()); err != nil {
		log.WarnContext(ctx, "parking the row failed; it is parked when its next try fails", slog.Any("error", err))
		return
	}
	p.cfg.Metrics.parked()
	log.WarnContext(ctx, "ledger retries parked: a person must look", slog.String("reason", cause.Error()))
}

// releaseQuiet gives the lease up, logging (not returning) a failure.
func (p *Processor) releaseQuiet(ctx context.Context, rec ledger.Record, cause error) {
	reason := "lease lost"
	if cause != nil {
		reason = cause.Error()
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := p.cfg.ledger.Release(ctx, rec, truncate(reason, 500)); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		p.cfg.Logger.WarnContext(ctx, "releasing lease failed; it will expire", slog.Any("error", err))
	}
}

// foundElsewhere stops a look-up from taking a charge the ledger already
// records for another key: an unmarked charge matched by customer, amount
// and description can be another team customer's when one Stripe customer
// pays for several (B2B). Then nobody can tell whether this key was
// charged: it stays pending, and a human is told (never a second charge,
// never a unique-charge violation).
func (p *Processor) foundElsewhere(ctx context.Context, rec ledger.Record, ev event.Event, found stripeapi.Charge) (Outcome, bool, error) {
	ids := []string{found.ID}
	if found.PaymentIntentID != "" {
		ids = append(ids, found.PaymentIntentID)
	}
	recs, err := p.cfg.ledger.ByChargeIDs(ctx, ids)
	if err != nil {
		res, err := p.release(ctx, rec, OutcomeRetryLater, fmt.Errorf("checking who the found charge belongs to: %w", err))
		return res, true, err
	}
	for _, other := range recs {
		if other.Key != rec.Key {
			detail := fmt.Sprintf("the only matching charge at Stripe, %s, is the ledger's charge of %s (one Stripe customer paying for several customers?): whether %s/%s was charged cannot be told; check at Stripe, then record or replay it by hand",
				found.ID, other.Key, ev.CustomerID, ev.BillingPeriod)
			p.cfg.Notifier.Notify(alerts.StripeLookupFailed(ev.CustomerID, ev.BillingPeriod, detail))
			res, err := p.release(ctx, rec, OutcomeRetryLater, errors.New(detail))
			return res, true, err
		}
	}
	return "", false, nil
}

// chargeQuery is how this key's charge is recognised at Stripe: by
// pelguard's marker and key, and, for charges without the marker (a team's
// old consumer, or this consumer with ChargeMetadata off), by customer,
// amount, currency and period or description (invariant 9).
func (p *Processor) chargeQuery(ev event.Event, rec ledger.Record) stripeapi.ChargeQuery {
	return stripeapi.ChargeQuery{
		StripeCustomerID: rec.StripeCustomerID, Since: lookupSince(rec, p.cfg.Witness.LostSince()), IdempotencyKey: rec.IdempotencyKey,
		CustomerID: rec.CustomerID, BillingPeriod: rec.BillingPeriod, AmountCents: rec.AmountCents, Currency: rec.Currency,
		Description: p.cfg.Description(ev),
	}
}

// lookupSince is how far back a look-up lists the customer's charges: an
// hour before pelguard's first attempt, or the start of the billing period
// when that is earlier, since a charge made before pelguard (an old
// consumer's, a re-published event's) can be older than pelguard's row;
// and, while a ledger rollback is being repaired, from where its losses
// begin (lostSince), since the row may be a lost one inserted again.
func lookupSince(rec ledger.Record, lostSince time.Time) time.Time {
	since := rec.FirstAttemptAt.Add(-time.Hour)
	if start, err := time.Parse("2006-01", rec.BillingPeriod); err == nil && start.Before(since) {
		since = start
	}
	if !lostSince.IsZero() && lostSince.Before(since) {
		since = lostSince
	}
	return since
}

// eventPastWindow: the event says it happened longer ago than the safe
// window (occurred_at), or its stream entry was added longer ago (the
// entry id's milliseconds). A first delivery of such an event may be the
// re-publication of one billed before the ledger lost its row (a restore,
// a failover to an asynchronous replica), or an entry that came back after
// a day (a Redis rollback, a paused fleet), under a key Stripe has
// forgotten: look before charging.
func eventPastWindow(ev event.Event, entryID string, now time.Time, window time.Duration) bool {
	if !ev.OccurredAt.IsZero() && now.Sub(ev.OccurredAt) > window {
		return true
	}
	added, ok := EntryTime(entryID)
	return ok && now.Sub(added) > window
}

// EntryTime is when a stream entry was added, from its id
// ("<unix ms>-<seq>"); ok is false for anything else (a ledger retry has
// no entry).
func EntryTime(id string) (time.Time, bool) {
	ms, _, found := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil || n <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// claimPastWindow: the current attempt's key may have been sent before
// (this is a takeover within the attempt) longer ago than the safe window.
// The window is measured per attempt: attempt n's key is new when attempt n
// begins.
func claimPastWindow(rec ledger.Record, now time.Time, window time.Duration) bool {
	return rec.TakenOverInAttempt() && now.Sub(rec.AttemptStartedAt) > window
}

func (p *Processor) finishOnly(ctx context.Context, rec ledger.Record, o ledger.Outcome) (Outcome, error) {
	ctx, cancel := detach(ctx)
	defer cancel()
	_, err := p.cfg.ledger.Finish(ctx, rec, o)
	if errors.Is(err, ledger.ErrLeaseLost) {
		// Someone took over (our lease expired). Whatever they record wins;
		// with the same idempotency key they got the same charge.
		return OutcomeLeaseLost, nil
	}
	if err != nil {
		return OutcomeRetryLater, fmt.Errorf("recording %s: %w", o.Status, err)
	}
	return "", nil
}

// release gives the lease up so the next delivery can retry at once.
func (p *Processor) release(ctx context.Context, rec ledger.Record, out Outcome, cause error) (Outcome, error) {
	reason := "lease lost"
	if cause != nil {
		reason = cause.Error()
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	if err := p.cfg.ledger.Release(dctx, rec, truncate(reason, 500)); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		p.cfg.Logger.WarnContext(ctx, "releasing lease failed; it will expire", slog.Any("error", err))
	}
	return p.leftPending(ctx, out, cause)
}

func (p *Processor) leftPending(_ context.Context, out Outcome, cause error) (Outcome, error) {
	return out, cause
}

// ack acknowledges one entry. Always per event, always after the ledger
// write it depends on has committed (invariant 3). A ledger-driven retry's
// hold (no stream) has no entry: nothing to ack.
func (p *Processor) ack(ctx context.Context, stream, id string) error {
	if stream == "" {
		return nil
	}
	p.hb.acking(stream, id)
	ctx, cancel := detach(ctx)
	defer cancel()
	ctx, span := p.tracer.Start(ctx, "redis.xack", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	if err := p.cfg.Witness.Mirror(ctx); err != nil {
		// The commit this ack follows is not witnessed outside Postgres
		// yet: no ack; the redelivery finds the row terminal.
		span.SetStatus(codes.Error, "ledger witness not mirrored")
		return err
	}
	if err := p.cfg.Redis.XAck(ctx, stream, p.cfg.Group, id).Err(); err != nil {
		span.SetStatus(codes.Error, "XACK failed")
		// Harmless for money: the ledger is terminal, so the redelivery (or
		// the reaper) acks it without a Stripe call.
		return fmt.Errorf("XACK %s %s: %w", stream, id, err)
	}
	return nil
}

func resultClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, stripeapi.ErrCardDeclined):
		return "declined"
	case errors.Is(err, stripeapi.ErrTransient):
		return "transient"
	default:
		return "permanent"
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// writeTimeout bounds the writes that must outlive the event's context (the
// outcome of a charge already made, the ack, a release): they ignore
// cancellation, but a hung Postgres or Redis must not hang shutdown forever.
// If one times out the entry stays pending and the idempotency key and the
// ledger make the redelivery safe.
const writeTimeout = 15 * time.Second

func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

// conflictDetail says why the ledger's row r and the event ev conflict. The
// same customer, amount and currency under another key can only be another
// namespace: say so, or the detail names two identical charges.
func conflictDetail(r ledger.Record, ev event.Event, namespace string) string {
	if r.StripeCustomerID == ev.StripeCustomerID && r.AmountCents == ev.AmountCents && r.Currency == ev.Currency &&
		r.IdempotencyKey != ev.Key(namespace) {
		other := "another namespace"
		if namespace != DefaultNamespace && r.IdempotencyKey == ev.Key(DefaultNamespace) {
			other = fmt.Sprintf("namespace %q (the default)", DefaultNamespace)
		}
		return fmt.Sprintf("the ledger already has %s for %s/%s with the same %d %s for %s, keyed under %s; "+
			"this process runs with --namespace %q: every role of the stream must run with the stream's namespace "+
			"(`pelguard-consumer namespace show`), then replay this dead letter",
			r.Status, r.CustomerID, r.BillingPeriod, r.AmountCents, r.Currency, r.StripeCustomerID, other, namespace)
	}
	return fmt.Sprintf("the ledger already has %s for %s/%s with %d %s for %s; this event says %d %s for %s",
		r.Status, r.CustomerID, r.BillingPeriod, r.AmountCents, r.Currency, r.StripeCustomerID,
		ev.AmountCents, ev.Currency, ev.StripeCustomerID)
}
