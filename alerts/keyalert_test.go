package alerts

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/stripeapi"
)

// A 401 from Stripe (the key is unknown, revoked) is titled as such, not
// "lacks a permission", which sends people hunting for a permission the key
// cannot be granted; a 403 keeps the missing-permission title and field.
func TestStripeKeyRejectedTitles(t *testing.T) {
	t.Parallel()
	srv := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(srv.Close)
	srv.SetKeyPermissions("rk_test_readonly", "customers_read")
	call := func(key string) error {
		c, err := stripeapi.New(stripeapi.Config{APIKey: key, BaseURL: srv.URL(), MaxNetworkRetries: stripeapi.RetriesFromFlag(0)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.GetCharge(context.Background(), "ch_missing")
		return err
	}

	revoked := call("rk_test_revokedOrNeverIssued") // a restricted key the account does not know: 401
	if !errors.Is(revoked, stripeapi.ErrAuthentication) {
		t.Fatalf("unknown key: %v, want a 401", revoked)
	}
	a := StripeKeyRejected(revoked)
	if !strings.Contains(a.Title, "invalid or revoked") || strings.Contains(a.Title, "permission") {
		t.Errorf("401 titled %q, want invalid or revoked", a.Title)
	}
	if strings.Contains(a.Text, "rk_test_revokedOrNeverIssued") {
		t.Errorf("401 alert prints the key: %s", a.Text)
	}

	denied := call("rk_test_readonly") // known, lacks charges_read: 403
	if !errors.Is(denied, stripeapi.ErrPermission) {
		t.Fatalf("restricted key: %v, want a 403", denied)
	}
	a = StripeKeyRejected(denied)
	if a.Title != "Stripe key lacks a permission" || len(a.Fields) != 1 || !strings.HasPrefix(a.Fields[0].Value, "rak_") {
		t.Errorf("403: title %q fields %+v, want the missing permission named", a.Title, a.Fields)
	}
	if k := StripeKeyRejected(revoked).Fingerprint; k == a.Fingerprint {
		t.Errorf("401 and 403 share fingerprint %q: one would suppress the other", k)
	}
}
