package consumer

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/stripeapi"
)

var decideNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func stripeErr(kind error, declineCode string) error {
	return &stripeapi.Error{Kind: kind, DeclineCode: declineCode, Message: "msg", PaymentIntentID: "pi_1"}
}

// The consumer's outcome table: each Stripe answer, for a row at a given
// attempt, under a policy, is one verdict.
func TestDecideCharge(t *testing.T) {
	t.Parallel()
	pol := RetryPolicy{Retries: 2, After: time.Hour}.withDefaults()
	none := RetryPolicy{Retries: NoDeclineRetries}.withDefaults()
	at := func(n int) ledger.Record {
		return ledger.Record{Key: ledger.Key{CustomerID: "c_1", BillingPeriod: "2026-11"}, Attempt: n}
	}
	type want struct {
		out    Outcome
		ledger ledgerStep
		status ledger.Status
		stream streamStep
		reason string
		retry  bool
		alert  alerts.Kind
	}
	cases := []struct {
		name string
		rec  ledger.Record
		res  chargeResult
		pol  RetryPolicy
		want want
	}{
		{"succeeded", at(1), chargeResult{Charge: stripeapi.Charge{ID: "ch_1", Status: "succeeded"}}, pol,
			want{out: OutcomeCharged, ledger: writeOutcome, status: ledger.StatusCharged, stream: ackEntry}},
		{"pending debit", at(1), chargeResult{Charge: stripeapi.Charge{ID: "ch_1", Status: "pending"}}, pol,
			want{out: OutcomeProcessing, ledger: writeOutcome, status: ledger.StatusProcessing, stream: ackEntry}},
		{"soft decline, retries left", at(1), chargeResult{Err: stripeErr(stripeapi.ErrCardDeclined, "insufficient_funds")}, pol,
			want{out: OutcomeDeclined, ledger: writeOutcome, status: ledger.StatusDeclined, stream: ackEntry, retry: true}},
		{"soft decline, last retry", at(3), chargeResult{Err: stripeErr(stripeapi.ErrCardDeclined, "insufficient_funds")}, pol,
			want{out: OutcomeDeclined, ledger: writeOutcome, status: ledger.StatusDeclined, stream: ackEntry, alert: alerts.KindChargeDeclined}},
		{"soft decline, retries off", at(1), chargeResult{Err: stripeErr(stripeapi.ErrCardDeclined, "do_not_honor")}, none,
			want{out: OutcomeDeclined, ledger: writeOutcome, status: ledger.StatusDeclined, stream: ackEntry, alert: alerts.KindChargeDeclined}},
		{"hard decline", at(1), chargeResult{Err: stripeErr(stripeapi.ErrCardDeclined, "stolen_card")}, pol,
			want{out: OutcomeDeclined, ledger: writeOutcome, status: ledger.StatusDeclined, stream: ackEntry, alert: alerts.KindChargeDeclined}},
		{"action required", at(1), chargeResult{Err: stripeErr(stripeapi.ErrActionRequired, "")}, pol,
			want{out: OutcomeActionRequired, ledger: writeOutcome, status: ledger.StatusActionRequired, stream: deadLetterEntry,
				reason: ReasonActionRequired, alert: alerts.KindActionRequired}},
		{"transient", at(1), chargeResult{Err: stripeErr(stripeapi.ErrTransient, "")}, pol,
			want{out: OutcomeRetryLater, ledger: releaseLease, stream: leaveEntry}},
		{"transient, lease lost", at(1), chargeResult{Err: stripeErr(stripeapi.ErrTransient, ""), LeaseLost: true}, pol,
			want{out: OutcomeLeaseLost, ledger: releaseLease, stream: leaveEntry}},
		{"permission", at(1), chargeResult{Err: stripeErr(stripeapi.ErrPermission, "")}, pol,
			want{out: OutcomeDeadLetter, ledger: releaseLease, stream: deadLetterEntry, reason: ReasonStripeKey, alert: alerts.KindPermissionDenied}},
		{"authentication", at(1), chargeResult{Err: stripeErr(stripeapi.ErrAuthentication, "")}, pol,
			want{out: OutcomeDeadLetter, ledger: releaseLease, stream: deadLetterEntry, reason: ReasonStripeKey, alert: alerts.KindPermissionDenied}},
		{"idempotency mismatch", at(1), chargeResult{Err: stripeErr(stripeapi.ErrIdempotencyMismatch, "")}, pol,
			want{ledger: lookUp}},
		{"invalid request", at(1), chargeResult{Err: stripeErr(stripeapi.ErrInvalidRequest, "")}, pol,
			want{out: OutcomeFailed, ledger: writeOutcome, status: ledger.StatusFailed, stream: deadLetterEntry,
				reason: ReasonStripePerm, alert: alerts.KindChargeFailed}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := decideCharge(c.rec, c.res, c.pol, decideNow)
			if v.Outcome != c.want.out || v.Ledger != c.want.ledger || v.Stream != c.want.stream || v.Reason != c.want.reason {
				t.Fatalf("verdict %+v, want %+v", v, c.want)
			}
			if v.Ledger == writeOutcome && v.Record.Status != c.want.status {
				t.Fatalf("records %s, want %s", v.Record.Status, c.want.status)
			}
			if got := !v.Record.RetryAt.IsZero(); got != c.want.retry {
				t.Fatalf("retry scheduled %v, want %v (%s)", got, c.want.retry, v.Record.RetryAt)
			}
			if c.want.retry && !v.Record.RetryAt.Equal(decideNow.Add(time.Hour)) {
				t.Fatalf("retry at %s, want after the policy's hour", v.Record.RetryAt)
			}
			switch {
			case c.want.alert == "" && v.Alert != nil:
				t.Fatalf("unexpected alert %s", v.Alert.Kind)
			case c.want.alert != "" && (v.Alert == nil || v.Alert.Kind != c.want.alert):
				t.Fatalf("alert %v, want %s", v.Alert, c.want.alert)
			}
		})
	}
}

// An earlier attempt's intent: cancelled → go on; moved money → record
// that charge; unreadable or stuck → release, never charge.
func TestDecidePrevious(t *testing.T) {
	t.Parallel()
	rec := ledger.Record{Attempt: 2, PaymentIntentID: "pi_1"}
	cases := []struct {
		name    string
		it      stripeapi.Intent
		err     error
		proceed bool
		out     Outcome
		status  ledger.Status
	}{
		{"cancelled", stripeapi.Intent{ID: "pi_1", Status: "canceled"}, nil, true, "", ""},
		{"succeeded", stripeapi.Intent{ID: "pi_1", Status: "succeeded", LatestChargeID: "ch_1"}, nil, false, OutcomeCharged, ledger.StatusCharged},
		{"processing", stripeapi.Intent{ID: "pi_1", Status: "processing", LatestChargeID: "ch_1"}, nil, false, OutcomeProcessing, ledger.StatusProcessing},
		{"processing without a charge", stripeapi.Intent{ID: "pi_1", Status: "processing"}, nil, false, OutcomeRetryLater, ""},
		{"unreadable", stripeapi.Intent{}, stripeErr(stripeapi.ErrPermission, ""), false, OutcomeRetryLater, ""},
	}
	for _, c := range cases {
		v, proceed := decidePrevious(rec, c.it, c.err, decideNow)
		if proceed != c.proceed || v.Outcome != c.out || (c.status != "" && v.Record.Status != c.status) {
			t.Errorf("%s: proceed %v, verdict %+v", c.name, proceed, v)
		}
		if c.out == OutcomeRetryLater && (v.Ledger != releaseLease || v.Cause == nil) {
			t.Errorf("%s: must release with a cause: %+v", c.name, v)
		}
	}
}

// Only a ledger-driven row's retry-later release, out of takeovers, is
// parked; a lost lease or a delivery-driven row is never.
func TestParkInstead(t *testing.T) {
	t.Parallel()
	rel := release(OutcomeRetryLater, errors.New("closing attempt 1's payment intent: 403"))
	spent := ledger.Record{Key: ledger.Key{CustomerID: "c_1", BillingPeriod: "2026-11"}, Attempt: 2, Redrives: MaxLedgerTakeovers}
	fresh := spent
	fresh.Redrives = MaxLedgerTakeovers - 1
	if v := parkInstead(spent, true, rel); v.Ledger != parkRow || v.Alert == nil || v.Alert.Kind != alerts.KindRetryParked ||
		!strings.Contains(v.Cause.Error(), "403") {
		t.Fatalf("out of takeovers: %+v", v)
	}
	if v := parkInstead(fresh, true, rel); v.Ledger != releaseLease || v.Alert != nil {
		t.Fatalf("takeovers left: %+v", v)
	}
	if v := parkInstead(spent, false, rel); v.Ledger != releaseLease {
		t.Fatalf("a delivery-driven row is bounded by the reaper, not parked: %+v", v)
	}
	if v := parkInstead(spent, true, release(OutcomeLeaseLost, nil)); v.Ledger != releaseLease {
		t.Fatalf("a lost lease is someone else's row: %+v", v)
	}
}

// A processing row's charge turning final.
func TestDecideSettlement(t *testing.T) {
	t.Parallel()
	pol := RetryPolicy{}.withDefaults()
	rec := ledger.Record{ChargeID: "ch_1", Attempt: 1}
	if s, a, final := decideSettlement(rec, "pending", "", "", pol, decideNow); final || a != nil || s.Succeeded {
		t.Fatal("pending is not final")
	}
	if s, a, final := decideSettlement(rec, "succeeded", "", "", pol, decideNow); !final || a != nil || !s.Succeeded {
		t.Fatal("succeeded")
	}
	if s, a, _ := decideSettlement(rec, "failed", "insufficient_funds", "", pol, decideNow); s.RetryAt.IsZero() || a != nil {
		t.Fatal("a retryable debit failure is re-presented without an alert")
	}
	last := rec
	last.Attempt = stripeapi.MaxDebitRepresentments + 1
	if s, a, _ := decideSettlement(last, "failed", "insufficient_funds", "", pol, decideNow); !s.RetryAt.IsZero() || a == nil {
		t.Fatal("past NACHA's re-presentments: final, with an alert")
	}
	if s, a, _ := decideSettlement(rec, "failed", "debit_not_authorized", "", pol, decideNow); !s.RetryAt.IsZero() || a == nil {
		t.Fatal("debit_not_authorized is never re-presented")
	}
	off := RetryPolicy{Retries: NoDeclineRetries}.withDefaults()
	if s, a, _ := decideSettlement(rec, "failed", "insufficient_funds", "", off, decideNow); !s.RetryAt.IsZero() || a == nil {
		t.Fatal("retries off: final, with an alert")
	}
}

// The zero policy is the defaults in every role; the CLI's "no retries"
// is NoDeclineRetries.
func TestRetryPolicyDefaults(t *testing.T) {
	t.Parallel()
	if p := (RetryPolicy{}).withDefaults(); p.Retries != DefaultDeclineRetries || p.After != DefaultDeclineRetryAfter {
		t.Fatalf("zero policy: %+v", p)
	}
	if at := (RetryPolicy{Retries: NoDeclineRetries}).withDefaults().retryAt(decideNow, 1, false); !at.IsZero() {
		t.Fatal("NoDeclineRetries must never retry")
	}
	if err := (RetryPolicy{After: time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "--decline-retry-after") {
		t.Fatalf("a too-short wait must name its flag: %v", err)
	}
}
