package stripeapi_test

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

const simKey = "sk_test_pelguardSECRETkey"

func newSim(t testing.TB, cfg stripesim.Config) *stripesim.Server {
	t.Helper()
	srv := stripesim.MustNew(cfg)
	t.Cleanup(srv.Close)
	return srv
}

func simClient(t testing.TB, srv *stripesim.Server, cfg stripeapi.Config) *stripeapi.Client {
	t.Helper()
	cfg.APIKey = cmp.Or(cfg.APIKey, simKey)
	cfg.BaseURL = srv.URL()
	c, err := stripeapi.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func pelguardReq(customer, period string, amount int64) stripeapi.ChargeRequest {
	key := "key-" + customer + "-" + period
	return stripeapi.ChargeRequest{
		IdempotencyKey: key, StripeCustomerID: "cus_" + customer, AmountCents: amount, Currency: "usd",
		Description: "Usage billing for " + period, Metadata: stripeapi.PelguardMetadata(customer, period, key),
	}
}

var modes = []stripeapi.Mode{stripeapi.ModePaymentIntents, stripeapi.ModeCharges}

// TestEmulatorErrorClasses drives each failure the emulator can produce
// through the adapter and checks the one classification.
func TestEmulatorErrorClasses(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()

			t.Run("decline_402", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{Faults: stripesim.Faults{DeclineCustomers: []string{"cus_d"}}})
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode}).Charge(t.Context(), pelguardReq("d", "2026-11", 100))
				wantKind(t, err, stripeapi.ErrCardDeclined, 402)
				var se *stripeapi.Error
				if errors.As(err, &se) && se.DeclineCode == "" {
					t.Errorf("decline code missing: %+v", se)
				}
			})

			t.Run("idempotency_mismatch_400", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{})
				c := simClient(t, srv, stripeapi.Config{Mode: mode})
				req := pelguardReq("m", "2026-11", 100)
				if _, err := c.Charge(t.Context(), req); err != nil {
					t.Fatal(err)
				}
				req.AmountCents = 200
				_, err := c.Charge(t.Context(), req)
				wantKind(t, err, stripeapi.ErrIdempotencyMismatch, 400)
			})

			t.Run("key_in_use_409", func(t *testing.T) {
				t.Parallel()
				// The first request is held inside the emulator, its key
				// claimed, until the second has had its answer: no sleep
				// decides who is first.
				claimed, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				srv := newSim(t, stripesim.Config{OnExecute: func(string) {
					once.Do(func() { close(claimed); <-release })
				}})
				c := simClient(t, srv, stripeapi.Config{Mode: mode, MaxNetworkRetries: -1})
				req := pelguardReq("u", "2026-11", 100)
				first := make(chan error, 1)
				go func() { _, err := c.Charge(t.Context(), req); first <- err }()
				<-claimed
				_, second := c.Charge(t.Context(), req)
				close(release)
				if err := <-first; err != nil {
					t.Fatalf("first: %v", err)
				}
				wantKind(t, second, stripeapi.ErrTransient, 409)
			})

			t.Run("restricted_key_403", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{})
				rk := "rk_test_readonlySECRET"
				srv.SetKeyPermissions(rk, "charges_read", "payment_intents_read")
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode, APIKey: rk}).Charge(t.Context(), pelguardReq("p", "2026-11", 100))
				wantKind(t, err, stripeapi.ErrPermission, 403)
			})

			t.Run("bad_key_401", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{})
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode, APIKey: "sk_bogus_SECRET123"}).Charge(t.Context(), pelguardReq("a", "2026-11", 100))
				wantKind(t, err, stripeapi.ErrAuthentication, 401)
			})

			t.Run("server_error_500", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{Faults: stripesim.Faults{ErrorRate: 1}})
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode, MaxNetworkRetries: -1}).Charge(t.Context(), pelguardReq("e", "2026-11", 100))
				wantKind(t, err, stripeapi.ErrTransient, 500)
			})

			t.Run("rate_limited_429", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{Faults: stripesim.Faults{RateLimitedRate: 1}})
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode, MaxNetworkRetries: -1}).Charge(t.Context(), pelguardReq("r", "2026-11", 100))
				wantKind(t, err, stripeapi.ErrTransient, 429)
			})

			t.Run("commit_then_drop", func(t *testing.T) {
				t.Parallel()
				srv := newSim(t, stripesim.Config{Faults: stripesim.Faults{DropNextCharges: 1, DropHang: true}})
				c := simClient(t, srv, stripeapi.Config{Mode: mode, MaxNetworkRetries: -1, Timeout: 300 * time.Millisecond})
				req := pelguardReq("x", "2026-11", 100)
				_, err := c.Charge(t.Context(), req)
				wantKind(t, err, stripeapi.ErrTransient, 0)
				// The charge exists although the caller saw a timeout; a retry
				// with the same key must return it, not make another.
				ch, err := c.Charge(t.Context(), req)
				if err != nil {
					t.Fatalf("retry: %v", err)
				}
				if n := srv.SucceededCharges("x", "2026-11"); n != 1 {
					t.Fatalf("succeeded charges = %d, want 1", n)
				}
				if stored := srv.Charges(); len(stored) != 1 || stored[0].ID != ch.ID {
					t.Fatalf("retry returned %s, stored %+v", ch.ID, stored)
				}
			})
		})
	}
}

func wantKind(t *testing.T, err, kind error, status int) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("want %v, got %v", kind, err)
	}
	var se *stripeapi.Error
	if !errors.As(err, &se) {
		t.Fatalf("not a *stripeapi.Error: %T %v", err, err)
	}
	if status != 0 && se.HTTPStatus != status {
		t.Errorf("status = %d, want %d (%v)", se.HTTPStatus, status, err)
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("key leaked into error: %v", err)
	}
}

func TestEmulatorIdempotentCharge(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			srv := newSim(t, stripesim.Config{})
			c := simClient(t, srv, stripeapi.Config{Mode: mode})
			req := pelguardReq("c_1", "2026-11", 2500)
			first, err := c.Charge(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			second, err := c.Charge(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if first.ID != second.ID || first.ID == "" {
				t.Fatalf("ids differ: %s vs %s", first.ID, second.ID)
			}
			if first.AmountCents != 2500 || first.Status != "succeeded" || first.StripeCustomerID != "cus_c_1" ||
				!stripeapi.IsPelguard(first.Metadata) || first.Metadata[stripeapi.MetaIdempotencyKey] != req.IdempotencyKey {
				t.Errorf("charge fields: %+v", first)
			}
			if mode == stripeapi.ModePaymentIntents && first.PaymentIntentID == "" {
				t.Errorf("no payment intent id")
			}
			if n := srv.SucceededCharges("c_1", "2026-11"); n != 1 {
				t.Fatalf("succeeded = %d", n)
			}
		})
	}
}

// TestEmulatorFindChargePastIdempotencyWindow: after 25 h the key no longer
// protects (a new charge would be made), and FindCharge is how a takeover
// learns that the first attempt did charge.
func TestEmulatorFindChargePastIdempotencyWindow(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{Now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)})
	c := simClient(t, srv, stripeapi.Config{})
	// Noise: another customer, and the same customer in another period.
	for _, r := range []stripeapi.ChargeRequest{pelguardReq("c_9", "2026-11", 100), pelguardReq("c_1", "2026-10", 100)} {
		if _, err := c.Charge(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	since := srv.Now().Add(-time.Minute)
	req := pelguardReq("c_1", "2026-11", 2500)
	req.StripeCustomerID = "cus_c_1"
	orig, err := c.Charge(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	srv.Advance(25 * time.Hour)

	got, found, err := c.FindCharge(t.Context(), stripeapi.ChargeQuery{StripeCustomerID: "cus_c_1", Since: since, IdempotencyKey: req.IdempotencyKey})
	if err != nil || !found || got.ID != orig.ID {
		t.Fatalf("FindCharge = %+v, %v, %v; want %s", got, found, err, orig.ID)
	}
	if _, found, err := c.FindCharge(t.Context(), stripeapi.ChargeQuery{StripeCustomerID: "cus_c_1", Since: since, IdempotencyKey: "other-key"}); err != nil || found {
		t.Fatalf("unknown key: found=%v err=%v", found, err)
	}
	if _, found, err := c.FindCharge(t.Context(), stripeapi.ChargeQuery{StripeCustomerID: "cus_c_1", Since: srv.Now().Add(-time.Hour), IdempotencyKey: req.IdempotencyKey}); err != nil || found {
		t.Fatalf("since after the charge: found=%v err=%v", found, err)
	}
}

func TestEmulatorListChargesWindow(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{Now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)})
	from := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(10 * 24 * time.Hour)
	want := map[string]bool{}
	seed := func(at time.Time, in bool) {
		ch := srv.SeedCharge(stripesim.ChargeSeed{Customer: "cus_l", Amount: 100, Created: at,
			Metadata: stripeapi.PelguardMetadata("c_l", at.Format("2006-01-02T15:04:05"), "k")})
		if in {
			want[ch.ID] = true
		}
	}
	for i := range 100 {
		seed(from.Add(-time.Duration(i+1)*time.Minute), false)
		seed(to.Add(time.Duration(i)*time.Minute), false) // to itself is excluded
	}
	for i := range 250 {
		seed(from.Add(time.Duration(i)*30*time.Minute), true) // from itself is included
	}
	got := map[string]bool{}
	err := simClient(t, srv, stripeapi.Config{}).ListCharges(t.Context(), from, to, func(ch stripeapi.Charge) error {
		if got[ch.ID] {
			return fmt.Errorf("charge %s listed twice", ch.ID)
		}
		got[ch.ID] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 250 {
		t.Fatalf("listed %d, want 250", len(got))
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("missing %s", id)
		}
	}
}

// TestEmulatorMetadataFromExpandedIntent: a charge created by an intent may
// not carry the intent's metadata; the adapter takes it from the intent.
func TestEmulatorMetadataFromExpandedIntent(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{ChargeOmitsIntentMetadata: true})
	c := simClient(t, srv, stripeapi.Config{Mode: stripeapi.ModePaymentIntents})
	req := pelguardReq("c_m", "2026-11", 700)
	ch, err := c.Charge(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if stored, _ := srv.Charge(ch.ID); len(stored.Metadata) != 0 {
		t.Fatalf("precondition: emulator stored charge metadata %v", stored.Metadata)
	}
	if ch.Metadata[stripeapi.MetaIdempotencyKey] != req.IdempotencyKey {
		t.Errorf("Charge metadata = %v", ch.Metadata)
	}
	var listed []stripeapi.Charge
	err = c.ListCharges(t.Context(), srv.Now().Add(-time.Hour), srv.Now().Add(time.Hour), func(ch stripeapi.Charge) error {
		listed = append(listed, ch)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || !stripeapi.IsPelguard(listed[0].Metadata) || listed[0].Metadata[stripeapi.MetaBillingPeriod] != "2026-11" {
		t.Fatalf("listed = %+v", listed)
	}
	if _, found, err := c.FindCharge(t.Context(), stripeapi.ChargeQuery{StripeCustomerID: "cus_c_m", Since: srv.Now().Add(-time.Hour), IdempotencyKey: req.IdempotencyKey}); err != nil || !found {
		t.Fatalf("FindCharge via intent metadata: found=%v err=%v", found, err)
	}
}

// TestListChargesExpandsIntentsOnlyWhenNeeded: pages are fetched without the
// expanded intent while charges carry their own metadata; once a page has an
// intent-made charge without it, that page and the rest are fetched expanded
// (one extra request), and every charge still comes back with its metadata.
func TestListChargesExpandsIntentsOnlyWhenNeeded(t *testing.T) {
	t.Parallel()
	const n = 250 // three pages
	for _, tc := range []struct {
		name         string
		omit         bool
		lean, expand int64 // list requests without and with the intent expanded
	}{
		{"charges carry metadata", false, 3, 0},
		{"charges lack intent metadata", true, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newSim(t, stripesim.Config{ChargeOmitsIntentMetadata: tc.omit})
			var lean, expand atomic.Int64
			hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && r.URL.Path == "/v1/charges" {
					if strings.Contains(r.URL.RawQuery, "payment_intent") {
						expand.Add(1)
					} else {
						lean.Add(1)
					}
				}
				return http.DefaultTransport.RoundTrip(r)
			})}
			c := simClient(t, srv, stripeapi.Config{Mode: stripeapi.ModePaymentIntents, HTTPClient: hc})
			for i := range n {
				if _, err := c.Charge(t.Context(), pelguardReq(fmt.Sprint("c_x", i), "2026-11", 100)); err != nil {
					t.Fatal(err)
				}
			}
			keys := map[string]bool{}
			err := c.ListCharges(t.Context(), srv.Now().Add(-time.Hour), srv.Now().Add(time.Hour), func(ch stripeapi.Charge) error {
				if !stripeapi.IsPelguard(ch.Metadata) || ch.PaymentIntentID == "" {
					return fmt.Errorf("charge %s: metadata %v, intent %q", ch.ID, ch.Metadata, ch.PaymentIntentID)
				}
				keys[ch.Metadata[stripeapi.MetaIdempotencyKey]] = true
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != n {
				t.Fatalf("listed %d distinct charges, want %d", len(keys), n)
			}
			if lean.Load() != tc.lean || expand.Load() != tc.expand {
				t.Fatalf("list requests: %d lean, %d expanded; want %d and %d", lean.Load(), expand.Load(), tc.lean, tc.expand)
			}
		})
	}
}

func TestEmulatorRefund(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{})
	c := simClient(t, srv, stripeapi.Config{})
	ch, err := c.Charge(t.Context(), pelguardReq("c_r", "2026-11", 2500))
	if err != nil {
		t.Fatal(err)
	}
	r1, err := c.Refund(t.Context(), ch.ID, 1000, "refund-"+ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Refund(t.Context(), ch.ID, 1000, "refund-"+ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r1.ID == "" || r1.ID != r2.ID || r1.ChargeID != ch.ID || r1.AmountCents != 1000 {
		t.Fatalf("refunds %+v %+v", r1, r2)
	}
	if stored, _ := srv.Charge(ch.ID); stored.AmountRefunded != 1000 {
		t.Fatalf("refunded %d, want 1000 (the retry must not refund again)", stored.AmountRefunded)
	}
	full, err := c.Refund(t.Context(), ch.ID, 0, "refund-rest-"+ch.ID)
	if err != nil || full.AmountCents != 1500 {
		t.Fatalf("refund of the rest: %+v, %v", full, err)
	}
	if srv.SucceededCharges("c_r", "2026-11") != 0 {
		t.Fatalf("fully refunded charge still counted")
	}
}

// GetCharge reports what was done behind pelguard's back: a partial refund
// by hand and a dispute.
func TestEmulatorGetChargeSeesRefundsByHandAndDisputes(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{})
	c := simClient(t, srv, stripeapi.Config{})
	ch, err := c.Charge(t.Context(), pelguardReq("c_g", "2026-11", 2500))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetCharge(t.Context(), ch.ID); err != nil || got.Disputed || got.AmountRefundedCents != 0 || got.Status != "succeeded" {
		t.Fatalf("fresh charge %+v %v", got, err)
	}
	if _, err := srv.RefundByHand(ch.ID, 500); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Dispute(ch.ID); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetCharge(t.Context(), ch.ID)
	if err != nil || !got.Disputed || got.AmountRefundedCents != 500 || got.Refunded {
		t.Fatalf("after refund by hand and dispute %+v %v", got, err)
	}
}

// pelguard's refunds carry its marker (and, through RefundCharge, who asked
// and which key), so a refund_ledger lost with a failover can be rebuilt:
// ListRefunds lists the account's refunds of a window, pelguard's and the
// ones made by hand.
func TestEmulatorListRefundsTellsPelguardsApart(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	srv := newSim(t, stripesim.Config{Now: start})
	c := simClient(t, srv, stripeapi.Config{})
	ctx := t.Context()
	var chs []stripeapi.Charge
	for i := range 4 {
		ch, err := c.Charge(ctx, pelguardReq(fmt.Sprintf("c_l%d", i), "2026-11", 2500))
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, ch)
	}
	old, err := c.Refund(ctx, chs[0].ID, 100, "refund-old") // before the window
	if err != nil || !old.Created.Equal(start) {
		t.Fatalf("refund %+v %v", old, err)
	}
	srv.Advance(time.Hour)
	plain, err := c.Refund(ctx, chs[1].ID, 0, "refund-plain")
	if err != nil {
		t.Fatal(err)
	}
	full, err := c.RefundCharge(ctx, stripeapi.RefundRequest{ChargeID: chs[2].ID, AmountCents: 300, IdempotencyKey: "refund-full",
		Source: "auditor refund", CustomerID: "c_l2", BillingPeriod: "2026-11"})
	if err != nil || full.AmountCents != 300 || full.Currency != "usd" {
		t.Fatalf("RefundCharge %+v %v", full, err)
	}
	byHand, err := srv.RefundByHand(chs[3].ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]stripeapi.Refund{}
	err = c.ListRefunds(ctx, start.Add(time.Minute), srv.Now().Add(time.Minute), func(r stripeapi.Refund) error {
		got[r.ID] = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[old.ID].ID != "" {
		t.Fatalf("listed %v: want the 3 refunds of the window", got)
	}
	if r := got[plain.ID]; !stripeapi.IsPelguardRefund(r.Metadata) || r.ChargeID != chs[1].ID || r.AmountCents != 2500 ||
		!r.Created.Equal(srv.Now()) || r.Reason != "duplicate" {
		t.Fatalf("pelguard's refund as listed: %+v", r)
	}
	if md := got[full.ID].Metadata; !stripeapi.IsPelguardRefund(md) || md[stripeapi.MetaRefundSource] != "auditor refund" ||
		md[stripeapi.MetaCustomerID] != "c_l2" || md[stripeapi.MetaBillingPeriod] != "2026-11" || stripeapi.IsPelguard(md) {
		t.Fatalf("RefundCharge's metadata: %v", md)
	}
	if r := got[byHand]; stripeapi.IsPelguardRefund(r.Metadata) {
		t.Fatalf("a refund by hand passes for pelguard's: %+v", r)
	}
	stop := errors.New("stop")
	if err := c.ListRefunds(ctx, start, srv.Now().Add(time.Minute), func(stripeapi.Refund) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn's error: %v", err)
	}
}
