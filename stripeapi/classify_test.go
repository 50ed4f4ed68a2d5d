package stripeapi_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// TestProcessingErrorIsASoftDecline: Stripe sends processing_error in two
// shapes, and both are a refusal a later attempt can overcome. Test card
// 4000000000000119 answers code processing_error with no decline_code; an
// issuer can also answer card_declined with decline_code processing_error.
// A decline class read from decline_code alone made the first shape hard:
// the customer went unbilled with a "hard decline" alert.
func TestProcessingErrorIsASoftDecline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		faults stripesim.Faults
		req    func(stripeapi.ChargeRequest) stripeapi.ChargeRequest
		mode   stripeapi.Mode
		code   string
		dcode  string
	}{
		{"code_form_test_payment_method", stripesim.Faults{}, func(r stripeapi.ChargeRequest) stripeapi.ChargeRequest {
			r.PaymentMethodID = stripesim.PMProcessingError
			return r
		}, stripeapi.ModePaymentIntents, "processing_error", ""},
		{"code_form_intents", stripesim.Faults{CardErrorCodes: map[string]string{"cus_pe": "processing_error"}}, nil,
			stripeapi.ModePaymentIntents, "processing_error", ""},
		{"code_form_charges", stripesim.Faults{CardErrorCodes: map[string]string{"cus_pe": "processing_error"}}, nil,
			stripeapi.ModeCharges, "processing_error", ""},
		{"decline_code_form_intents", stripesim.Faults{DeclineCodes: map[string]string{"cus_pe": "processing_error"}}, nil,
			stripeapi.ModePaymentIntents, "card_declined", "processing_error"},
		{"decline_code_form_charges", stripesim.Faults{DeclineCodes: map[string]string{"cus_pe": "processing_error"}}, nil,
			stripeapi.ModeCharges, "card_declined", "processing_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newSim(t, stripesim.Config{Faults: tc.faults})
			req := pelguardReq("pe", "2026-11", 100)
			if tc.req != nil {
				req = tc.req(req)
			}
			_, err := simClient(t, srv, stripeapi.Config{Mode: tc.mode}).Charge(t.Context(), req)
			wantKind(t, err, stripeapi.ErrCardDeclined, http.StatusPaymentRequired)
			var se *stripeapi.Error
			if !errors.As(err, &se) || se.Code != tc.code || se.DeclineCode != tc.dcode {
				t.Fatalf("code/decline_code = %q/%q, want %q/%q", se.Code, se.DeclineCode, tc.code, tc.dcode)
			}
			if got := stripeapi.DeclineClassOf(err); got != stripeapi.DeclineSoft {
				t.Errorf("DeclineClassOf = %q, want soft", got)
			}
			if se.FailureCode() != "processing_error" {
				t.Errorf("FailureCode = %q, want processing_error", se.FailureCode())
			}
			// Nothing was charged: the failed charge holds no money.
			for _, ch := range srv.Charges() {
				if ch.Status != "failed" {
					t.Errorf("charge %s is %s after a decline", ch.ID, ch.Status)
				}
			}
		})
	}
}

// TestAdviceCodeDecidesTheDeclineClass: the issuer's advice_code (Stripe
// sends it on the error body; stripe-go v76 has no field for it) overrides
// what the decline_code alone would say.
func TestAdviceCodeDecidesTheDeclineClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dcode, advice string
		kind                error
		want                stripeapi.DeclineClass
	}{
		// insufficient_funds alone is soft; the issuer says never again.
		{"do_not_try_again", "insufficient_funds", "do_not_try_again", stripeapi.ErrCardDeclined, stripeapi.DeclineHard},
		// transaction_not_allowed alone is hard; the issuer says later.
		{"try_again_later", "transaction_not_allowed", "try_again_later", stripeapi.ErrCardDeclined, stripeapi.DeclineSoft},
		// A reported stolen card stays hard whatever the advice.
		{"stolen_stays_hard", "stolen_card", "try_again_later", stripeapi.ErrCardDeclined, stripeapi.DeclineHard},
		// The card's data is wrong: only the customer can fix it.
		{"confirm_card_data", "generic_decline", "confirm_card_data", stripeapi.ErrActionRequired, stripeapi.DeclineAction},
		{"no_advice", "generic_decline", "", stripeapi.ErrCardDeclined, stripeapi.DeclineSoft},
	} {
		for _, mode := range modes {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				f := stripesim.Faults{DeclineCodes: map[string]string{"cus_ad": tc.dcode}}
				if tc.advice != "" {
					f.AdviceCodes = map[string]string{"cus_ad": tc.advice}
				}
				srv := newSim(t, stripesim.Config{Faults: f})
				_, err := simClient(t, srv, stripeapi.Config{Mode: mode}).Charge(t.Context(), pelguardReq("ad", "2026-11", 100))
				wantKind(t, err, tc.kind, http.StatusPaymentRequired)
				var se *stripeapi.Error
				if !errors.As(err, &se) || se.AdviceCode != tc.advice || se.DeclineCode != tc.dcode {
					t.Fatalf("advice/decline = %q/%q, want %q/%q", se.AdviceCode, se.DeclineCode, tc.advice, tc.dcode)
				}
				if got := stripeapi.DeclineClassOf(err); got != tc.want {
					t.Errorf("DeclineClassOf = %q, want %q", got, tc.want)
				}
				if len(srv.Charges()) != 1 || srv.Charges()[0].Status != "failed" {
					t.Errorf("charges %+v, want one failed", srv.Charges())
				}
			})
		}
	}
	if got := stripeapi.DeclineClassOf(errors.New("not stripe")); got != stripeapi.DeclineNone {
		t.Errorf("DeclineClassOf(other error) = %q", got)
	}
}

// TestProxyAnswerIsUnknownOutcome: a 4xx whose body is not a Stripe error
// (an HTML page or a bare JSON from a load balancer or corporate proxy) may
// come after the request reached Stripe. Here the proxy forwards the charge
// to the emulator, which makes it, and then answers its own 4xx. The
// answer must be transient (retry with the same key), never a permanent
// failure that advances the attempt: the retry through a healthy path then
// finds the one charge, and no second one is made.
func TestProxyAnswerIsUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		body   string
	}{
		{"html_403", http.StatusForbidden, "text/html", "<html><body>403 Forbidden</body></html>"},
		{"html_404", http.StatusNotFound, "text/html", "<html>404 Not Found</html>"},
		{"html_413", http.StatusRequestEntityTooLarge, "text/html", "<html>413 Request Entity Too Large</html>"},
		{"html_401", http.StatusUnauthorized, "text/html", "<html>401</html>"},
		{"json_no_error_object", http.StatusForbidden, "application/json", `{"message":"Forbidden"}`},
		{"json_error_without_type", http.StatusBadRequest, "application/json", `{"error":{"message":"blocked by policy"}}`},
	} {
		for _, mode := range modes {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				t.Parallel()
				sim := newSim(t, stripesim.Config{})
				target, _ := url.Parse(sim.URL())
				proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					out, _ := http.NewRequestWithContext(r.Context(), r.Method, target.String()+r.URL.RequestURI(), bytes.NewReader(body))
					out.Header = r.Header.Clone()
					resp, err := http.DefaultClient.Do(out)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
					}
					w.Header().Set("Content-Type", tc.ctype) // no Request-Id: not Stripe's answer
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, tc.body)
				}))
				t.Cleanup(proxy.Close)
				c := mustNew(t, stripeapi.Config{APIKey: simKey, BaseURL: proxy.URL, Mode: mode, MaxNetworkRetries: -1})
				req := pelguardReq("px", "2026-11", 100)
				_, err := c.Charge(t.Context(), req)
				if !errors.Is(err, stripeapi.ErrTransient) {
					t.Fatalf("want transient (unknown outcome), got %v", err)
				}
				var se *stripeapi.Error
				if !errors.As(err, &se) || se.HTTPStatus != tc.status {
					t.Errorf("status not kept: %+v", se)
				}
				// The retry with the same key, through a path that works.
				ch, err := simClient(t, sim, stripeapi.Config{Mode: mode}).Charge(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				if n := sim.SucceededCharges("px", "2026-11"); n != 1 || sim.ChargeCreates() != 1 {
					t.Fatalf("%d succeeded charges, %d creates; want 1 (charge %s)", n, sim.ChargeCreates(), ch.ID)
				}
			})
		}
	}
}

// TestFindChargeMatchesTeamChargeNamingThePeriod: in switch mode a team's
// charge carries no pelguard metadata and the team's own description. A
// look-up that wanted pelguard's exact description missed it, so the key
// was charged again once Stripe forgot it (24 h): a double charge.
func TestFindChargeMatchesTeamChargeNamingThePeriod(t *testing.T) {
	t.Parallel()
	srv := newSim(t, stripesim.Config{})
	team := simClient(t, srv, stripeapi.Config{Mode: stripeapi.ModeCharges})
	since := srv.Now().Add(-time.Hour)
	charge := func(key, desc string, amount int64) stripeapi.Charge {
		t.Helper()
		ch, err := team.Charge(t.Context(), stripeapi.ChargeRequest{IdempotencyKey: key, StripeCustomerID: "cus_sw",
			AmountCents: amount, Currency: "usd", Description: desc})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	prev := charge("team-oct", "Acme usage, period 2026-10, billed 2026-11-01", 2500)
	cur := charge("team-nov", "Acme usage, period 2026-11 (42 units)", 2500)
	q := func(period string, amount int64) stripeapi.ChargeQuery {
		return stripeapi.ChargeQuery{StripeCustomerID: "cus_sw", Since: since, IdempotencyKey: "pelguard-key-" + period,
			CustomerID: "c_sw", BillingPeriod: period, AmountCents: amount, Currency: "usd",
			Description: "Usage billing for " + period}
	}
	got, found, err := team.FindCharge(t.Context(), q("2026-11", 2500))
	if err != nil || !found || got.ID != cur.ID {
		t.Fatalf("2026-11: found=%v %s err=%v; want the team's %s (not %s)", found, got.ID, err, cur.ID, prev.ID)
	}
	if got, found, err := team.FindCharge(t.Context(), q("2026-10", 2500)); err != nil || !found || got.ID != prev.ID {
		t.Fatalf("2026-10: found=%v %s err=%v; want %s", found, got.ID, err, prev.ID)
	}
	// A period named by no charge (2026-12), another amount, a prefix of a
	// period, a charge naming no period: nothing, so it is charged.
	charge("team-misc", "Acme one-off setup fee", 2700)
	for _, miss := range []stripeapi.ChargeQuery{q("2026-12", 2500), q("2026-11", 2600), q("2026-1", 2500), q("2026-11", 2700)} {
		if got, found, err := team.FindCharge(t.Context(), miss); err != nil || found {
			t.Errorf("%s %d: found %s (err %v), want none", miss.BillingPeriod, miss.AmountCents, got.ID, err)
		}
	}
	if n := len(srv.Charges()); n != 3 {
		t.Fatalf("%d charges, want 3", n)
	}
}
