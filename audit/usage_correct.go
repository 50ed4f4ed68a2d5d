package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/stripeapi"
)

// Corrections of open usage findings, each the one Stripe allows at the
// finding's age, at most one per finding and per window, recorded in
// usage_corrections before its first call:
//
//   - usage_over on a sum meter, while the invoice that bills the window is
//     open (InvoiceClosesAt): one meter event of the opposite sign, timed at
//     the window's start, under an identifier of its own derived from the
//     window ("pgc_…"). Cancelling an event (a meter event adjustment) is
//     not used: the excess is not pelguard's event (pelguard sends each of
//     its events once), so its identifier is unknown.
//   - usage_under, while the invoice is open and Stripe still guards every
//     event of the window (each first sent less than SafeWindow ago): the
//     window's delivered events sent again under their own identifiers and
//     a fresh idempotency key. Stripe refuses the ones it has (a duplicate
//     identifier) and counts the ones it dropped after their 200. Past the
//     window a re-send could count twice an event that the lagging summary
//     simply had not shown yet: never done.
//   - everything else (a count meter's over-count, a final invoice, an old
//     window, too many events) names the correction a person must make:
//     ManualAction, in the meter's units.
//
// A correction recorded and not yet carried out (a crash, a transient
// error) is carried out by the next run under the same identifier and
// idempotency key while Stripe still guards them (ResendUntil), and handed
// to a person after: never made twice. It is confirmed when its finding
// resolves (the window's totals agree): summaries lag, so that may take a
// run or two.

// Correction kinds.
const (
	CorrectionNegativeEvent = "negative_event"
	CorrectionResend        = "resend"
)

// UsageCorrection is one row of usage_corrections, or a correction a run
// did not make (Skipped says why).
type UsageCorrection struct {
	FindingID        int64     `json:"finding_id"`
	Kind             string    `json:"kind"`
	Identifier       string    `json:"identifier"`
	EventName        string    `json:"event_name"`
	StripeCustomerID string    `json:"stripe_customer_id"`
	WindowStart      time.Time `json:"window_start"`
	WindowEnd        time.Time `json:"window_end"`
	// Units is the value sent (negative_event) or the units the window
	// lacked (resend).
	Units       int64     `json:"units"`
	EventTS     time.Time `json:"event_ts"`
	Status      string    `json:"status"` // recorded, sent, failed, unknown
	ResendUntil time.Time `json:"resend_until"`
	EventsSent  int       `json:"events_sent,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	Skipped     string    `json:"skipped,omitempty"`
	// Seq numbers the window's corrections (1, 2, …): the identifier is
	// derived from (window, Seq). Attempts counts the calls made for it.
	Seq      int `json:"seq"`
	Attempts int `json:"attempts,omitempty"`

	decidedOn [2]int64 // the finding's Stripe and ledger values it was decided on
}

// correctionPlan is what a finding calls for: a correction, or a manual
// action.
type correctionPlan struct {
	c      UsageCorrection
	manual string
	// notFinal: the manual action may change on a later run (the window
	// was compared before it settled).
	notFinal bool
}

const correctionCols = `finding_id, kind, identifier, event_name, stripe_customer_id, window_start, window_end,
	units::bigint, event_ts, status, resend_until, events_sent, coalesce(last_error, ''), seq, attempts`

func scanCorrection(row pgx.CollectableRow) (UsageCorrection, error) {
	var c UsageCorrection
	err := row.Scan(&c.FindingID, &c.Kind, &c.Identifier, &c.EventName, &c.StripeCustomerID, &c.WindowStart, &c.WindowEnd,
		&c.Units, &c.EventTS, &c.Status, &c.ResendUntil, &c.EventsSent, &c.LastError, &c.Seq, &c.Attempts)
	c.WindowStart, c.WindowEnd, c.EventTS, c.ResendUntil = c.WindowStart.UTC(), c.WindowEnd.UTC(), c.EventTS.UTC(), c.ResendUntil.UTC()
	return c, err
}

// UsageCorrections lists the corrections recorded, newest first.
func (s *Store) UsageCorrections(ctx context.Context, limit int) ([]UsageCorrection, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+correctionCols+` FROM {schema}.usage_corrections
		ORDER BY recorded_at DESC, finding_id DESC LIMIT $1`, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("listing usage corrections: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanCorrection)
	if err != nil {
		return nil, fmt.Errorf("listing usage corrections: %w", err)
	}
	return out, nil
}

// correctionIdentifier names correction seq of one window: never the same
// identifier twice (usage_corrections.identifier is unique; Stripe would
// refuse a repeated one as a duplicate for 24 h). The first keeps the form
// of the time when a window had one correction.
func correctionIdentifier(prefix string, f UsageFinding, seq int) string {
	key := fmt.Sprintf("%s\x00%s\x00%d\x00%d", f.EventName, f.StripeCustomerID, f.WindowStart.Unix(), f.WindowEnd.Unix())
	if seq > 1 {
		key += fmt.Sprintf("\x00%d", seq)
	}
	h := sha256.Sum256([]byte(key))
	return prefix + hex.EncodeToString(h[:20])
}

// plan decides what f calls for at now, as the window's correction seq.
func (a *Auditor) plan(ctx context.Context, f UsageFinding, seq int, now time.Time) (correctionPlan, error) {
	u := a.cfg.Usage
	delta := f.Delta()
	units := "units"
	if f.Measure == "count" {
		units = "events"
	}
	where := fmt.Sprintf("meter %s, customer %s, window %s–%s", f.EventName, f.StripeCustomerID,
		f.WindowStart.Format(time.RFC3339), f.WindowEnd.Format(time.RFC3339))

	early := ""
	if f.Early != "" {
		early = " " + f.Early
	}
	if closes := u.InvoiceClosesAt(f.StripeCustomerID, f.WindowStart); !now.Before(closes) {
		if delta > 0 {
			return correctionPlan{manual: fmt.Sprintf("credit the customer %d %s (%s): Stripe billed them over what pelguard delivered; "+
				"the invoice was finalized at %s, so no meter event can change it%s", delta, units, where, closes.Format(time.RFC3339), early),
				notFinal: early != ""}, nil
		}
		return correctionPlan{manual: fmt.Sprintf("invoice %d %s by hand (%s): Stripe did not count them; the invoice was finalized at %s%s",
			-delta, units, where, closes.Format(time.RFC3339), early), notFinal: early != ""}, nil
	}
	if f.Early != "" {
		return correctionPlan{manual: fmt.Sprintf("Stripe counts %d %s %s than pelguard sent (%s).%s", abs(delta), units,
			map[bool]string{true: "more", false: "fewer"}[delta > 0], where, early), notFinal: true}, nil
	}
	if seq > u.MaxWindowCorrections {
		return correctionPlan{manual: fmt.Sprintf("Stripe counts %d %s %s than pelguard sent (%s), after %d corrections of this window "+
			"(--usage-max-window-corrections): something keeps changing it; find the other sender, then correct by hand",
			abs(delta), units, map[bool]string{true: "more", false: "fewer"}[delta > 0], where, seq-1)}, nil
	}
	c := UsageCorrection{FindingID: f.ID, EventName: f.EventName, StripeCustomerID: f.StripeCustomerID,
		WindowStart: f.WindowStart, WindowEnd: f.WindowEnd, EventTS: f.WindowStart, Status: "recorded", Seq: seq,
		decidedOn: [2]int64{f.StripeValue, f.LedgerValue}}
	if delta > 0 {
		if f.Measure == "count" {
			return correctionPlan{manual: fmt.Sprintf("Stripe counts %d events more than pelguard delivered (%s); a count meter is not "+
				"lowered by an event of the opposite sign and the extra events are not pelguard's: their sender may cancel them "+
				"within 24 h of sending, else credit %d events", delta, where, delta)}, nil
		}
		// Stripe takes timestamps up to 35 days old: keep 10 minutes for
		// the time until the call.
		if err := stripeapi.CheckMeterTimestamp(c.EventTS, now.Add(10*time.Minute)); err != nil {
			return correctionPlan{manual: fmt.Sprintf("credit the customer %d %s (%s): the window is too old for a meter event", delta, units, where)}, nil
		}
		c.Kind, c.Identifier, c.Units = CorrectionNegativeEvent, correctionIdentifier("pgc_", f, seq), -delta
		c.ResendUntil = now.Add(u.SafeWindow)
		return correctionPlan{c: c}, nil
	}
	evs, more, err := a.meters.DeliveredInWindow(ctx, f.EventName, f.StripeCustomerID, f.WindowStart, f.WindowEnd, u.MaxResendEvents)
	if err != nil {
		return correctionPlan{}, err
	}
	manual := fmt.Sprintf("Stripe counts %d %s fewer than pelguard delivered (%s). ", -delta, units, where)
	switch {
	case len(evs) == 0:
		return correctionPlan{manual: manual + "The ledger has no delivered event there now: check the meter at Stripe."}, nil
	case more:
		return correctionPlan{manual: manual + fmt.Sprintf("The window holds more than %d events (--usage-max-resend-events): "+
			"after checking the meter at Stripe, send the missing usage as one meter event, or invoice it by hand.", u.MaxResendEvents)}, nil
	}
	c.ResendUntil = evs[0].FirstSentAt.Add(u.SafeWindow)
	for _, e := range evs {
		c.ResendUntil = minTime(c.ResendUntil, e.FirstSentAt.Add(u.SafeWindow))
		if stripeapi.CheckMeterTimestamp(e.EventTS, now.Add(10*time.Minute)) != nil {
			c.ResendUntil = now
		}
	}
	if !now.Before(c.ResendUntil) {
		return correctionPlan{manual: manual + "Stripe may no longer guard these events' identifiers, so a re-send could count twice " +
			"an event the lagging summary had not shown yet: after checking the meter at Stripe, send the missing usage as one meter event " +
			"(a new identifier), or invoice it by hand."}, nil
	}
	c.Kind, c.Identifier, c.Units = CorrectionResend, correctionIdentifier("pgr_", f, seq), -delta
	return correctionPlan{c: c}, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// nameManualCorrections, without AutoCorrect, writes on each open finding
// what would correct it: the call pelguard would make, or the person's
// correction.
func (a *Auditor) nameManualCorrections(ctx context.Context, rep *UsageReport) error {
	now := a.cfg.Clock.Now().UTC()
	fs, err := a.store.uncorrectedUsage(ctx, now.Add(-a.cfg.Usage.SettleDelay))
	if err != nil {
		return err
	}
	for _, x := range fs {
		f := x.UsageFinding
		if rep.isHeld(f) {
			continue
		}
		p, err := a.plan(ctx, f, x.seq, now)
		if err != nil {
			return err
		}
		text := p.manual
		if text == "" {
			text = describeCorrection(p.c) + " (what --usage-auto-correct would do now)"
		}
		if err := a.store.setManualAction(ctx, f.ID, text, p.manual != "" && !p.notFinal); err != nil {
			return err
		}
	}
	return nil
}

func describeCorrection(c UsageCorrection) string {
	if c.Kind == CorrectionNegativeEvent {
		return fmt.Sprintf("send a meter event of value %d to %s for %s at %s under identifier %s",
			c.Units, c.EventName, c.StripeCustomerID, c.EventTS.Format(time.RFC3339), c.Identifier)
	}
	return fmt.Sprintf("send the window's delivered events of %s for %s again under their own identifiers (Stripe refuses the ones it has; %d units are missing)",
		c.EventName, c.StripeCustomerID, c.Units)
}

// correctUsage finishes the corrections left recorded, then corrects the
// open findings that have none, within the caps.
func (a *Auditor) correctUsage(ctx context.Context, rep *UsageReport) error {
	u := a.cfg.Usage
	now := a.cfg.Clock.Now().UTC()
	left, err := a.store.recordedCorrections(ctx)
	if err != nil {
		return err
	}
	for _, c := range left {
		if !now.Before(c.ResendUntil) {
			// Recorded, maybe sent, and Stripe may have forgotten the
			// identifier: sending now could count it twice.
			c.Status, c.LastError = "unknown", "recorded but not confirmed sent before Stripe's identifier window passed"
			manual := fmt.Sprintf("correction %s of %d units was recorded at pelguard but its call may or may not have reached Stripe "+
				"before its identifier window passed: check the meter at Stripe, then correct by hand if needed", c.Identifier, c.Units)
			if err := a.store.finishCorrection(ctx, c, manual, now); err != nil {
				return err
			}
			rep.Corrections = append(rep.Corrections, c)
			continue
		}
		rep.Corrections = append(rep.Corrections, a.carryOut(ctx, c, now))
	}
	fs, err := a.store.uncorrectedUsage(ctx, now.Add(-u.SettleDelay))
	if err != nil {
		return err
	}
	made, units := 0, int64(0)
	last24, err := a.store.correctionsSince(ctx, now.Add(-24*time.Hour))
	if err != nil {
		return err
	}
	for _, x := range fs {
		f := x.UsageFinding
		if rep.isHeld(f) {
			continue // its delivery has not settled: decided once it has
		}
		p, err := a.plan(ctx, f, x.seq, now)
		if err != nil {
			return err
		}
		if p.manual != "" {
			if err := a.store.setManualAction(ctx, f.ID, p.manual, !p.notFinal); err != nil {
				return err
			}
			continue
		}
		c := p.c
		skip := ""
		switch {
		case made >= u.MaxCorrections:
			skip = fmt.Sprintf("cap: %d corrections per run (--usage-max-corrections)", u.MaxCorrections)
		case units+abs(c.Units) > u.MaxUnits:
			skip = fmt.Sprintf("cap: %d units per run (--usage-max-units)", u.MaxUnits)
		case last24+made >= u.MaxCorrections24h:
			skip = fmt.Sprintf("cap: %d corrections in 24 h (--usage-max-corrections-24h)", u.MaxCorrections24h)
		}
		if skip == "" {
			busy, err := a.store.overlappingCorrection(ctx, f)
			if err != nil {
				return err
			}
			if busy {
				skip = "a correction of an overlapping window is not confirmed yet"
			}
		}
		if skip != "" {
			c.Skipped, c.Status = skip, ""
			rep.Corrections = append(rep.Corrections, c)
			continue
		}
		recorded, err := a.store.recordCorrection(ctx, c, now)
		if err != nil {
			return err
		}
		if !recorded {
			continue // this correction exists: never twice
		}
		made++
		units += abs(c.Units)
		a.log.Info("usage correction recorded", slog.Int64("finding_id", f.ID), slog.String("kind", c.Kind),
			slog.String("identifier", c.Identifier), slog.Int64("units", c.Units))
		if hook := a.cfg.Test.AfterUsageCorrectionRecorded; hook != nil {
			if err := hook(c); err != nil {
				return err // a crash between the record and the call
			}
		}
		rep.Corrections = append(rep.Corrections, a.carryOut(ctx, c, now))
	}
	return nil
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// carryOut makes a recorded correction's calls and records how they ended.
// A transient error leaves it recorded for the next run.
func (a *Auditor) carryOut(ctx context.Context, c UsageCorrection, now time.Time) UsageCorrection {
	var err error
	switch c.Kind {
	case CorrectionNegativeEvent:
		// The call is counted before it is made: a duplicate refusal means
		// an earlier call of this very correction counted only if there
		// was one.
		if err = a.store.countCorrectionAttempt(ctx, &c); err != nil {
			break
		}
		_, err = a.stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: c.EventName, StripeCustomerID: c.StripeCustomerID,
			Value: c.Units, Identifier: c.Identifier, Timestamp: c.EventTS})
		if errors.Is(err, stripeapi.ErrDuplicateIdentifier) {
			if c.Attempts > 1 {
				err = nil // an earlier call of this very correction reached Stripe
			} else {
				err = fmt.Errorf("%w: Stripe already has identifier %s though this correction was never sent before; it did not count", err, c.Identifier)
			}
		}
		if err == nil {
			c.EventsSent = 1
		}
	case CorrectionResend:
		var evs []windowEvent
		var more bool
		evs, more, err = a.deliveredInWindow(ctx, c)
		if err == nil && more {
			err = fmt.Errorf("the window holds more than %d events", a.cfg.Usage.MaxResendEvents)
		}
		c.EventsSent = 0
		for _, e := range evs {
			if err != nil {
				break
			}
			var res stripeapi.MeterEventResult
			res, err = a.stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: c.EventName, StripeCustomerID: c.StripeCustomerID,
				Value: e.value, Identifier: e.identifier, Timestamp: e.ts, IdempotencyKey: resendKey(c, e.identifier)})
			switch {
			case errors.Is(err, stripeapi.ErrDuplicateIdentifier):
				err = nil // Stripe has it: not the missing one
			case err == nil && !res.Replayed:
				c.EventsSent++
			}
		}
	}
	manual := ""
	switch {
	case err == nil && c.Kind == CorrectionResend && c.EventsSent == 0:
		c.Status, c.LastError = "sent", ""
		manual = fmt.Sprintf("the window's events were sent again (%s) and Stripe refused every one as already counted: "+
			"if the %d units are still missing once the summaries catch up, Stripe dropped an event whose identifier it keeps: "+
			"send the missing usage as one meter event (a new identifier), or invoice it by hand", c.Identifier, c.Units)
	case err == nil:
		c.Status, c.LastError = "sent", ""
	case errors.Is(err, stripeapi.ErrTransient):
		c.LastError = err.Error()
		a.log.Warn("usage correction not finished: the next run carries it on", slog.String("identifier", c.Identifier), slog.Any("error", err))
	default:
		c.Status, c.LastError = "failed", err.Error()
		manual = fmt.Sprintf("correction %s (%s of %d units) was refused by Stripe: %s; correct by hand", c.Identifier, c.Kind, c.Units, err)
	}
	if ferr := a.store.finishCorrection(context.WithoutCancel(ctx), c, manual, now); ferr != nil {
		c.LastError = errors.Join(err, ferr).Error()
	}
	return c
}

// resendKey is the idempotency key of one event of a resend correction:
// the same for every call of that correction, another for the window's
// next one (the first keeps its form of old).
func resendKey(c UsageCorrection, identifier string) string {
	if c.Seq > 1 {
		return fmt.Sprintf("pelguard-usage-resend-%d:%s", c.Seq, identifier)
	}
	return "pelguard-usage-resend:" + identifier
}

// countCorrectionAttempt records, before a call, that c is called once more.
func (s *Store) countCorrectionAttempt(ctx context.Context, c *UsageCorrection) error {
	if err := s.pool.QueryRow(ctx, `UPDATE {schema}.usage_corrections SET attempts = attempts + 1
		WHERE finding_id = $1 AND seq = $2 RETURNING attempts`, c.FindingID, c.Seq).Scan(&c.Attempts); err != nil {
		return fmt.Errorf("counting a call of usage correction %s: %w", c.Identifier, err)
	}
	return nil
}

type windowEvent struct {
	identifier string
	ts         time.Time
	value      int64
}

func (a *Auditor) deliveredInWindow(ctx context.Context, c UsageCorrection) ([]windowEvent, bool, error) {
	evs, more, err := a.meters.DeliveredInWindow(ctx, c.EventName, c.StripeCustomerID, c.WindowStart, c.WindowEnd, a.cfg.Usage.MaxResendEvents)
	out := make([]windowEvent, len(evs))
	for i, e := range evs {
		out[i] = windowEvent{identifier: e.Identifier, ts: e.EventTS, value: e.Value}
	}
	return out, more, err
}

// --- SQL ---

// correctable is an open finding a correction may be decided for, and the
// number its next correction would have.
type correctable struct {
	UsageFinding
	seq int
}

// uncorrectedUsage: open findings whose manual action does not rule a
// correction out, none of whose corrections is still recorded (not
// finished), and whose last correction was sent before settled (its effect
// is part of the summary the finding was compared with).
func (s *Store) uncorrectedUsage(ctx context.Context, settled time.Time) ([]correctable, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+usageFindingCols("f")+`, coalesce(k.n, 0) + 1 FROM {schema}.usage_findings f
		LEFT JOIN LATERAL (SELECT max(c.seq) AS n, bool_or(c.status = 'recorded') AS pending,
				max(coalesce(c.sent_at, c.recorded_at)) AS last
			FROM {schema}.usage_corrections c WHERE c.finding_id = f.id) k ON true
		LEFT JOIN LATERAL (SELECT c.stripe_value, c.ledger_value FROM {schema}.usage_corrections c
			WHERE c.finding_id = f.id ORDER BY c.seq DESC LIMIT 1) p ON true
		WHERE f.state = 'open' AND NOT coalesce(f.manual_action LIKE '!%', false)
			AND NOT coalesce(k.pending, false) AND (k.last IS NULL OR k.last < $1)
			-- The last correction is part of the summary compared: the
			-- values moved since it was decided.
			AND (k.n IS NULL OR p.stripe_value IS DISTINCT FROM f.stripe_value OR p.ledger_value IS DISTINCT FROM f.ledger_value)
		ORDER BY f.opened_at, f.id`, settled)
	if err != nil {
		return nil, fmt.Errorf("reading uncorrected usage findings: %w", err)
	}
	fs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (correctable, error) {
		var c correctable
		var kind string
		err := row.Scan(&c.ID, &kind, &c.State, &c.EventName, &c.MeterID, &c.StripeCustomerID, &c.WindowStart, &c.WindowEnd,
			&c.Measure, &c.LedgerValue, &c.StripeValue, &c.Checks, &c.Resolution, &c.ManualAction, &c.UnknownLow, &c.UnknownHigh,
			&c.Unknown, &c.Early, &c.seq)
		c.Kind, c.WindowStart, c.WindowEnd = UsageKind(kind), c.WindowStart.UTC(), c.WindowEnd.UTC()
		c.ManualAction = manualText(c.ManualAction)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading uncorrected usage findings: %w", err)
	}
	return fs, nil
}

// setManualAction writes a finding's manual action; final marks one that
// rules out an automatic correction for good (stored with a leading "!",
// which readers strip).
func (s *Store) setManualAction(ctx context.Context, id int64, text string, final bool) error {
	if final {
		text = "!" + text
	}
	if _, err := s.pool.Exec(ctx, `UPDATE {schema}.usage_findings SET manual_action = $2 WHERE id = $1`, id, text); err != nil {
		return fmt.Errorf("naming the correction of usage finding %d: %w", id, err)
	}
	return nil
}

func manualText(s string) string {
	if len(s) > 0 && s[0] == '!' {
		return s[1:]
	}
	return s
}

func (s *Store) recordedCorrections(ctx context.Context) ([]UsageCorrection, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+correctionCols+` FROM {schema}.usage_corrections
		WHERE status = 'recorded' ORDER BY recorded_at, finding_id`)
	if err != nil {
		return nil, fmt.Errorf("reading unfinished usage corrections: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanCorrection)
	if err != nil {
		return nil, fmt.Errorf("reading unfinished usage corrections: %w", err)
	}
	return out, nil
}

func (s *Store) correctionsSince(ctx context.Context, since time.Time) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM {schema}.usage_corrections WHERE recorded_at >= $1`, since).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting usage corrections: %w", err)
	}
	return n, nil
}

// overlappingCorrection: another finding of an overlapping window of the
// same meter and customer has a correction and is not resolved (its effect
// may not show in the summaries yet).
func (s *Store) overlappingCorrection(ctx context.Context, f UsageFinding) (bool, error) {
	var busy bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}.usage_corrections c
		JOIN {schema}.usage_findings o ON o.id = c.finding_id
		WHERE c.event_name = $1 AND c.stripe_customer_id = $2 AND c.window_start < $4 AND c.window_end > $3
			AND o.id <> $5 AND o.state NOT IN ('resolved', 'dismissed'))`,
		f.EventName, f.StripeCustomerID, f.WindowStart, f.WindowEnd, f.ID).Scan(&busy)
	if err != nil {
		return false, fmt.Errorf("checking overlapping usage corrections: %w", err)
	}
	return busy, nil
}

// recordCorrection inserts c before any call; false when the finding
// already has a correction of that number (or the identifier exists).
func (s *Store) recordCorrection(ctx context.Context, c UsageCorrection, now time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, `INSERT INTO {schema}.usage_corrections (finding_id, seq, kind, identifier, event_name,
			stripe_customer_id, window_start, window_end, units, event_ts, resend_until, source, recorded_at, stripe_value, ledger_value)
		VALUES ($1, $12, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'auto', $11, $13, $14) ON CONFLICT DO NOTHING`,
		c.FindingID, c.Kind, c.Identifier, c.EventName, c.StripeCustomerID, c.WindowStart, c.WindowEnd, c.Units, c.EventTS, c.ResendUntil, now, c.Seq,
		c.decidedOn[0], c.decidedOn[1])
	if err != nil {
		return false, fmt.Errorf("recording usage correction %s: %w", c.Identifier, err)
	}
	return tag.RowsAffected() == 1, nil
}

// finishCorrection records a correction's outcome (and, when a person must
// act, the finding's manual action).
func (s *Store) finishCorrection(ctx context.Context, c UsageCorrection, manual string, now time.Time) error {
	var sentAt *time.Time
	if c.Status == "sent" {
		sentAt = &now
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording usage correction %s: %w", c.Identifier, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `UPDATE {schema}.usage_corrections SET status = $2, sent_at = coalesce($3, sent_at),
		events_sent = $4, last_error = nullif($5, '') WHERE finding_id = $1 AND seq = $6 AND status = 'recorded'`,
		c.FindingID, c.Status, sentAt, c.EventsSent, c.LastError, c.Seq); err != nil {
		return fmt.Errorf("recording usage correction %s: %w", c.Identifier, err)
	}
	if manual != "" {
		if _, err := tx.Exec(ctx, `UPDATE {schema}.usage_findings SET manual_action = $2 WHERE id = $1`, c.FindingID, "!"+manual); err != nil {
			return fmt.Errorf("recording usage correction %s: %w", c.Identifier, err)
		}
	}
	return tx.Commit(ctx)
}
