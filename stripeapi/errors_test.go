package stripeapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pelguard/pelguard/stripeapi"
)

const secretKey = "sk_test_SECRETsecretSECRET1234"

func chargeReq() stripeapi.ChargeRequest {
	return stripeapi.ChargeRequest{
		IdempotencyKey: "k1", StripeCustomerID: "cus_1", AmountCents: 100, Currency: "usd",
		Metadata: stripeapi.PelguardMetadata("c_1", "2026-11", "k1"),
	}
}

// TestClassifyCannedResponses checks the one classification switch against
// the bodies real Stripe sends, independent of any emulator.
func TestClassifyCannedResponses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   error
		code   string
	}{
		{"card_declined", 402, `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"Your card has insufficient funds."}}`, stripeapi.ErrCardDeclined, "card_declined"},
		{"idempotency_mismatch", 400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`, stripeapi.ErrIdempotencyMismatch, ""},
		{"key_in_use", 409, `{"error":{"type":"invalid_request_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key."}}`, stripeapi.ErrTransient, "idempotency_key_in_use"},
		{"rate_limit", 429, `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests"}}`, stripeapi.ErrTransient, "rate_limit"},
		{"lock_timeout", 429, `{"error":{"type":"invalid_request_error","code":"lock_timeout","message":"lock"}}`, stripeapi.ErrTransient, "lock_timeout"},
		{"api_error_500", 500, `{"error":{"type":"api_error","message":"Something went wrong"}}`, stripeapi.ErrTransient, ""},
		{"html_502", 502, `<html>bad gateway</html>`, stripeapi.ErrTransient, ""},
		{"permission", 403, `{"error":{"type":"invalid_request_error","message":"The provided key 'rk_test_abc***1234' does not have the required permissions"}}`, stripeapi.ErrPermission, ""},
		{"authentication", 401, `{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: ` + secretKey + `"}}`, stripeapi.ErrAuthentication, ""},
		{"invalid_request", 400, `{"error":{"type":"invalid_request_error","code":"parameter_missing","param":"amount","message":"Missing required param: amount."}}`, stripeapi.ErrInvalidRequest, "parameter_missing"},
		{"not_found", 404, `{"error":{"type":"invalid_request_error","code":"resource_missing","message":"No such customer"}}`, stripeapi.ErrInvalidRequest, "resource_missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Request-Id", "req_123")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(srv.Close)
			var logs bytes.Buffer
			c, err := stripeapi.New(stripeapi.Config{
				APIKey: secretKey, BaseURL: srv.URL, Mode: stripeapi.ModeCharges, MaxNetworkRetries: -1,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Charge(t.Context(), chargeReq())
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			var se *stripeapi.Error
			if !errors.As(err, &se) {
				t.Fatalf("not a *stripeapi.Error: %T", err)
			}
			if se.HTTPStatus != tc.status || se.Code != tc.code {
				t.Errorf("status/code = %d/%q, want %d/%q", se.HTTPStatus, se.Code, tc.status, tc.code)
			}
			for _, s := range []string{err.Error(), logs.String()} {
				if strings.Contains(s, "SECRET") || strings.Contains(s, "rk_test_abc") {
					t.Errorf("key leaked: %s", s)
				}
			}
		})
	}
}

func TestTransportFailuresAreTransient(t *testing.T) {
	t.Parallel()
	t.Run("connection_refused", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		c := mustNew(t, stripeapi.Config{APIKey: secretKey, BaseURL: "http://" + addr, MaxNetworkRetries: -1})
		_, err = c.Charge(t.Context(), chargeReq())
		if !errors.Is(err, stripeapi.ErrTransient) {
			t.Fatalf("want transient, got %v", err)
		}
	})
	t.Run("attempt_timeout", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(func() { close(release); srv.Close() })
		c := mustNew(t, stripeapi.Config{APIKey: secretKey, BaseURL: srv.URL, MaxNetworkRetries: -1, Timeout: 50 * time.Millisecond})
		_, err := c.Charge(t.Context(), chargeReq())
		if !errors.Is(err, stripeapi.ErrTransient) {
			t.Fatalf("want transient, got %v", err)
		}
	})
	t.Run("caller_cancel", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The server notices a closed connection only once the body
			// has been read; release covers the rest.
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(func() { close(release); srv.Close() })
		c := mustNew(t, stripeapi.Config{APIKey: secretKey, BaseURL: srv.URL})
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Charge(ctx, chargeReq())
		if !errors.Is(err, stripeapi.ErrTransient) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("want transient wrapping ctx.Err(), got %v", err)
		}
	})
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []stripeapi.Config{
		{},
		{APIKey: secretKey, Mode: "bogus"},
		{APIKey: secretKey, BaseURL: "not a url"},
		{APIKey: secretKey, RateLimit: -1},
		{APIKey: secretKey + " ", BaseURL: "http://x"},
	} {
		_, err := stripeapi.New(cfg)
		if err == nil {
			t.Errorf("New(%+v) accepted", cfg.Mode)
			continue
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("key in error: %v", err)
		}
	}
}

// TestRateLimitSharedAndObserved: every request waits on the one limiter,
// and Observe sees each operation.
func TestRateLimitSharedAndObserved(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte(`{"id":"ch_1","object":"charge","amount":100,"currency":"usd","status":"succeeded","created":1700000000}`))
	}))
	t.Cleanup(srv.Close)
	var observed atomic.Int64
	c := mustNew(t, stripeapi.Config{
		APIKey: secretKey, BaseURL: srv.URL, Mode: stripeapi.ModeCharges, RateLimit: 20, Burst: 1,
		Observe: func(op string, d time.Duration, err error) {
			if op == "charge" && err == nil {
				observed.Add(1)
			}
		},
	})
	start := time.Now()
	done := make(chan error, 6)
	for range 6 {
		go func() { _, err := c.Charge(t.Context(), chargeReq()); done <- err }()
	}
	for range 6 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// 6 requests at 20/s with burst 1 need at least 5 intervals of 50ms.
	if el := time.Since(start); el < 240*time.Millisecond {
		t.Errorf("6 requests took %s, rate limit not applied", el)
	}
	if observed.Load() != 6 || hits.Load() != 6 {
		t.Errorf("observed %d, hits %d, want 6", observed.Load(), hits.Load())
	}
}

func mustNew(t *testing.T, cfg stripeapi.Config) *stripeapi.Client {
	t.Helper()
	c, err := stripeapi.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// Decline classes: the emulator's soft codes are soft, its hard ones and
// unknown codes hard; only insufficient_funds re-presents a bank debit.
func TestDeclineClasses(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]stripeapi.DeclineClass{
		"insufficient_funds": stripeapi.DeclineSoft, "do_not_honor": stripeapi.DeclineSoft,
		"try_again_later": stripeapi.DeclineSoft, "generic_decline": stripeapi.DeclineSoft,
		"stolen_card": stripeapi.DeclineHard, "lost_card": stripeapi.DeclineHard, "fraudulent": stripeapi.DeclineHard,
		"pickup_card": stripeapi.DeclineHard, "expired_card": stripeapi.DeclineHard, "": stripeapi.DeclineHard,
		"a_code_stripe_adds_next_year": stripeapi.DeclineHard,
	} {
		if got := stripeapi.ClassifyDecline(code); got != want {
			t.Errorf("%q: %s, want %s", code, got, want)
		}
	}
	for code, want := range map[string]bool{"insufficient_funds": true, "account_closed": false, "no_account": false, "debit_not_authorized": false} {
		if stripeapi.DebitRetryable(code) != want {
			t.Errorf("debit %q retryable = %v", code, !want)
		}
	}
}
