package reaper

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/ledger"
)

// notDecidedByDecideEntry are the kinds decideEntry never returns, and why:
// each comes from an I/O outcome (or is not about an entry at all). Every
// other kind in Kinds() needs a row in TestDecideEntry.
var notDecidedByDecideEntry = map[Kind]string{
	KindRedriven:       "the outcome of a re-drive (consumer.Processor), after act's claim",
	KindClaimLost:      "XCLAIM's min-idle fence refused, in act",
	KindError:          "a Redis or ledger call failed, in act",
	KindRemoveConsumer: "consumer hygiene: about a consumer, not a pending entry",
}

// The decision table (DESIGN.md "Reaper, per pass", step 3), without Redis
// or Postgres: one row per kind at least, and the order in which the checks
// win over each other.
func TestDecideEntry(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cfg := decideConfig{MaxDeliveries: 10, Rules: event.Rules{MaxAmountCents: 100_000}}
	ev := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	key := ledger.EventKey(ev)
	row := func(status ledger.Status, mod func(*ledger.Record)) *ledger.Record {
		r := &ledger.Record{Key: key, StripeCustomerID: ev.StripeCustomerID, AmountCents: ev.AmountCents,
			Currency: ev.Currency, Status: status}
		if mod != nil {
			mod(r)
		}
		return r
	}
	lease := func(until time.Time) func(*ledger.Record) {
		return func(r *ledger.Record) { r.LeaseOwner, r.LeaseExpiresAt = "consumer-7", until }
	}
	// in builds an entry delivered deliveries times, whose payload's quick
	// reading was key and whose ledger row (nil: none) is rec.
	in := func(payload string, rec *ledger.Record, deliveries int64) decideInput {
		d := decideInput{
			Pending: redis.XPendingExt{ID: "1700000000000-0", Consumer: "dead-consumer", Idle: 2 * time.Minute, RetryCount: deliveries},
			Fields:  map[string]any{event.PayloadField: payload}, RowKey: key, Now: now,
		}
		if rec != nil {
			d.Row, d.HasRow = *rec, true
		}
		return d
	}
	canonical := ev.Payload()
	reordered := `{"billing_period":"2026-11","amount_cents":2500,"stripe_customer_id":"cus_1","customer_id":"c_1","trace":"x"}`
	with := func(d decideInput, f func(*decideInput)) decideInput { f(&d); return d }

	covered := map[Kind]bool{}
	for _, c := range []struct {
		name   string
		in     decideInput
		want   verdict
		detail string // a substring of the dead letter's detail
	}{
		{name: "in flight: nothing else looked at",
			in:   with(in("", nil, 99), func(d *decideInput) { d.InFlight, d.Gone, d.Fields = true, true, nil }),
			want: verdict{Kind: KindInFlight}},
		{name: "body gone",
			in:   with(in("", row(ledger.StatusCharged, nil), 99), func(d *decideInput) { d.Gone, d.Fields = true, nil }),
			want: verdict{Kind: KindGone}},
		{name: "invalid: missing field",
			in:     in(`{"customer_id":"c_1"}`, nil, 1),
			want:   verdict{Kind: KindInvalid, Reason: event.ReasonMissingField},
			detail: "invalid event"},
		{name: "invalid: not JSON, even past max deliveries",
			in:   in(`not json`, nil, 99),
			want: verdict{Kind: KindInvalid, Reason: event.ReasonNotJSON}},
		{name: "invalid: no payload field",
			in:   with(in("", nil, 1), func(d *decideInput) { d.Fields = map[string]any{"other": "x"} }),
			want: verdict{Kind: KindInvalid, Reason: event.ReasonMissingPayload}},
		{name: "invalid by the configured rules",
			in: in(event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 200_000,
				BillingPeriod: "2026-11", Currency: "usd"}.Payload(), nil, 1),
			want: verdict{Kind: KindInvalid, Reason: event.ReasonAmountTooLarge}},
		{name: "already billed: canonical payload",
			in:   in(canonical, row(ledger.StatusCharged, nil), 1),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusCharged)}},
		{name: "already billed: valid but not canonical",
			in:   in(reordered, row(ledger.StatusCharged, nil), 1),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusCharged)}},
		{name: "already billed: declined is terminal too",
			in:   in(canonical, row(ledger.StatusDeclined, nil), 1),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusDeclined)}},
		{name: "already billed: processing (money in motion) is not redelivered",
			in:   in(canonical, row(ledger.StatusProcessing, nil), 1),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusProcessing)}},
		{name: "already billed: a plain redelivery of an action_required row",
			in:   in(canonical, row(ledger.StatusActionRequired, nil), 1),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusActionRequired)}},
		{name: "claim: a replayed dead letter of an action_required row charges its next attempt",
			in: with(in(canonical, row(ledger.StatusActionRequired, nil), 1), func(d *decideInput) {
				d.Fields[consumer.ReplayedFromField] = "1699999999999-0"
			}),
			want: verdict{Kind: KindClaim, Key: "c_1/2026-11"}},
		{name: "already billed: a replayed dead letter of a charged row",
			in: with(in(canonical, row(ledger.StatusCharged, nil), 1), func(d *decideInput) {
				d.Fields[consumer.ReplayedFromField] = "1699999999999-0"
			}),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusCharged)}},
		{name: "already billed wins over max deliveries",
			in:   in(canonical, row(ledger.StatusCharged, nil), 99),
			want: verdict{Kind: KindAlreadyBilled, Key: "c_1/2026-11", Reason: string(ledger.StatusCharged)}},
		{name: "conflict: billed row with another amount",
			in:     in(canonical, row(ledger.StatusCharged, func(r *ledger.Record) { r.AmountCents = 999 }), 1),
			want:   verdict{Kind: KindConflict, Key: "c_1/2026-11", Reason: consumer.ReasonConflict},
			detail: "the ledger has charged for c_1/2026-11 with 999 usd for cus_1; this event says 2500 usd for cus_1"},
		{name: "conflict: billed row for another Stripe customer, past max deliveries",
			in:   in(reordered, row(ledger.StatusFailed, func(r *ledger.Record) { r.StripeCustomerID = "cus_2" }), 99),
			want: verdict{Kind: KindConflict, Key: "c_1/2026-11", Reason: consumer.ReasonConflict}},
		{name: "lease live: slow, not dead",
			in: in(canonical, row(ledger.StatusPending, lease(now.Add(time.Minute))), 1),
			want: verdict{Kind: KindLeaseLive, Key: "c_1/2026-11",
				Reason: "lease held by consumer-7 until 2026-12-01T12:01:00Z"}},
		{name: "lease live wins over max deliveries",
			in: in(canonical, row(ledger.StatusPending, lease(now.Add(time.Nanosecond))), 99),
			want: verdict{Kind: KindLeaseLive, Key: "c_1/2026-11",
				Reason: "lease held by consumer-7 until 2026-12-01T12:00:00.000000001Z"}},
		{name: "max deliveries: exactly the limit",
			in:     in(canonical, nil, 10),
			want:   verdict{Kind: KindMaxDeliveries, Key: "c_1/2026-11", Reason: consumer.ReasonMaxDelivery},
			detail: "delivered 10 times (max 10); last owner dead-consumer, idle 2m0s"},
		{name: "max deliveries: lease expired at now",
			in:   in(canonical, row(ledger.StatusPending, lease(now)), 11),
			want: verdict{Kind: KindMaxDeliveries, Key: "c_1/2026-11", Reason: consumer.ReasonMaxDelivery}},
		{name: "claim: no row",
			in:   in(canonical, nil, 1),
			want: verdict{Kind: KindClaim, Key: "c_1/2026-11"}},
		{name: "claim: one below the limit, lease expired",
			in:   in(reordered, row(ledger.StatusPending, lease(now.Add(-time.Second))), 9),
			want: verdict{Kind: KindClaim, Key: "c_1/2026-11"}},
		{name: "claim: pending row without a lease",
			in:   in(canonical, row(ledger.StatusPending, nil), 1),
			want: verdict{Kind: KindClaim, Key: "c_1/2026-11"}},
		{name: "unregistered owner: left alone, even with a billed row",
			in: with(in(canonical, row(ledger.StatusCharged, nil), 1), func(d *decideInput) { d.OwnerUnknown = true }),
			want: verdict{Kind: KindUnregistered, Key: "c_1/2026-11",
				Reason: "owner dead-consumer never registered as a pelguard consumer; name it in --stopped-consumers once it is stopped, or run `pelguard-consumer import` for 2026-11"}},
		{name: "unregistered owner of an entry with no row: never claimed",
			in: with(in(canonical, nil, 99), func(d *decideInput) { d.OwnerUnknown = true }),
			want: verdict{Kind: KindUnregistered, Key: "c_1/2026-11",
				Reason: "owner dead-consumer never registered as a pelguard consumer; name it in --stopped-consumers once it is stopped, or run `pelguard-consumer import` for 2026-11"}},
		// Not decisions: the row given is not the payload's.
		{name: "quick reading found no key: ask for the row",
			in:   with(in(reordered, nil, 1), func(d *decideInput) { d.RowKey = ledger.Key{} }),
			want: verdict{NeedRow: true, Lookup: key}},
		{name: "quick reading misread the key: never decide on the wrong row",
			in: with(in(`{"customer_id":"c_1","m":{"billing_period":"1999-01"},"stripe_customer_id":"cus_1","amount_cents":2500,"billing_period":"2026-11"}`,
				&ledger.Record{Key: ledger.Key{CustomerID: "c_1", BillingPeriod: "1999-01"}, Status: ledger.StatusCharged}, 1),
				func(d *decideInput) { d.RowKey = ledger.Key{CustomerID: "c_1", BillingPeriod: "1999-01"} }),
			want: verdict{NeedRow: true, Lookup: key}},
	} {
		got := decideEntry(cfg, c.in)
		detail := got.Detail
		got.Detail = ""
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
		if !strings.Contains(detail, c.detail) {
			t.Errorf("%s: detail %q, want it to contain %q", c.name, detail, c.detail)
		}
		if isDeadLetter(got.Kind) && detail == "" {
			t.Errorf("%s: a dead letter without a detail", c.name)
		}
		covered[c.want.Kind] = true
	}

	// Every kind has a row, or a reason it cannot have one.
	all := map[Kind]bool{}
	for _, k := range Kinds() {
		all[k] = true
		why, excluded := notDecidedByDecideEntry[k]
		switch {
		case excluded && covered[k]:
			t.Errorf("kind %q has a row but is listed as not decided by decideEntry (%s)", k, why)
		case !excluded && !covered[k]:
			t.Errorf("kind %q has no row in the decision table: add one, or list it in notDecidedByDecideEntry with the reason", k)
		}
	}
	for k := range notDecidedByDecideEntry {
		if !all[k] {
			t.Errorf("notDecidedByDecideEntry lists %q, which Kinds() does not", k)
		}
	}
}

func isDeadLetter(k Kind) bool {
	return k == KindInvalid || k == KindConflict || k == KindMaxDeliveries
}

// A NeedRow verdict, answered with the row it asked for, becomes a decision
// on that row: what page does with refetchRows.
func TestDecideEntryOnTheRowItAskedFor(t *testing.T) {
	t.Parallel()
	ev := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	misread := ledger.Key{CustomerID: "c_1", BillingPeriod: "1999-01"}
	in := decideInput{
		Pending: redis.XPendingExt{ID: "1-0", RetryCount: 1},
		Fields: map[string]any{event.PayloadField: `{"customer_id":"c_1","m":{"billing_period":"1999-01"},` +
			`"stripe_customer_id":"cus_1","amount_cents":2500,"billing_period":"2026-11"}`},
		RowKey: misread, Now: time.Unix(0, 0),
	}
	cfg := decideConfig{MaxDeliveries: 10}
	v := decideEntry(cfg, in)
	if !v.NeedRow || v.Lookup != ledger.EventKey(ev) {
		t.Fatalf("first verdict %+v, want a request for %s", v, ledger.EventKey(ev))
	}
	in.RowKey = v.Lookup
	in.Row = ledger.Record{Key: v.Lookup, StripeCustomerID: "cus_1", AmountCents: 2500, Currency: "usd", Status: ledger.StatusCharged}
	in.HasRow = true
	if v := decideEntry(cfg, in); v.Kind != KindAlreadyBilled || v.NeedRow {
		t.Fatalf("second verdict %+v, want already_billed", v)
	}
}

// Once `consumer import` has run for the entry's period, an unregistered
// owner's entries are decided like a dead pelguard consumer's: after the
// ledger check.
func TestDecideUnregisteredOwnerOfAnImportedPeriod(t *testing.T) {
	t.Parallel()
	ev := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	key := ledger.EventKey(ev)
	cfg := decideConfig{MaxDeliveries: 10, Imported: map[string]bool{"2026-11": true}}
	base := decideInput{Pending: redis.XPendingExt{ID: "1-0", Consumer: "worker-1", RetryCount: 1},
		Fields: map[string]any{event.PayloadField: ev.Payload()}, RowKey: key, OwnerUnknown: true}
	if got := decideEntry(cfg, base); got.Kind != KindClaim {
		t.Fatalf("no row, period imported: %s, want claim", got.Kind)
	}
	billed := base
	billed.Row, billed.HasRow = ledger.Record{Key: key, StripeCustomerID: "cus_1", AmountCents: 2500, Currency: "usd", Status: ledger.StatusCharged}, true
	if got := decideEntry(cfg, billed); got.Kind != KindAlreadyBilled {
		t.Fatalf("imported row: %s, want already_billed", got.Kind)
	}
	other := base
	other.Fields = map[string]any{event.PayloadField: event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-12", Currency: "usd"}.Payload()}
	other.RowKey = ledger.Key{CustomerID: "c_1", BillingPeriod: "2026-12"}
	if got := decideEntry(cfg, other); got.Kind != KindUnregistered {
		t.Fatalf("a period not imported: %s, want unregistered_consumer", got.Kind)
	}
}

// External-ledger mode (the team's table is the ledger): a row with a
// charge or a terminal status is already billed; a row with neither is the
// team's consumer's; no row is a claim (behind the min-idle fence, which
// is at least twice the team's longest Stripe call).
func TestDecideExternalLedger(t *testing.T) {
	t.Parallel()
	ev := event.Event{CustomerID: "c_1", StripeCustomerID: "cus_1", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
	key := ledger.EventKey(ev)
	cfg := decideConfig{MaxDeliveries: 10, External: true}
	base := decideInput{Pending: redis.XPendingExt{ID: "1-0", Consumer: "worker-1", RetryCount: 1},
		Fields: map[string]any{event.PayloadField: ev.Payload()}, RowKey: key}
	withRow := func(status ledger.Status, charge string) decideInput {
		d := base
		d.Row, d.HasRow = ledger.Record{Key: key, Status: status, ChargeID: charge}, true
		return d
	}
	for _, c := range []struct {
		name string
		in   decideInput
		want Kind
	}{
		{"no row: claim", base, KindClaim},
		{"a charge id: already billed", withRow("charged", "ch_1"), KindAlreadyBilled},
		{"card_declined: already billed", withRow("card_declined", ""), KindAlreadyBilled},
		{"neither: the team's consumer decides", withRow("processing", ""), KindLeaseLive},
	} {
		if got := decideEntry(cfg, c.in); got.Kind != c.want {
			t.Errorf("%s: %s, want %s", c.name, got.Kind, c.want)
		}
	}
}
