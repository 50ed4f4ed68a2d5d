package stripeapi

import (
	"errors"
	"strings"
	"testing"
)

// A key of the wrong kind is refused naming the kind found and the kinds
// wanted, and the message never carries the key.
func TestCheckKey(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"sk_live_51HqLyjWDarjtT1zdp7dc", "sk_test_4eC39HqLyjWDarjtT1zdp7dc", "rk_live_51HqLyjWDarjtT1zdp7dc",
		"rk_test_readonly", "sk_test_pelguard_consumer", "sk_test_x"} {
		if err := CheckKey(ok); err != nil {
			t.Errorf("CheckKey(%q) = %v, want nil", ok, err)
		}
	}
	for key, want := range map[string]string{
		"pk_live_TYooMQauvdEDq54NiTphI7jx":   "publishable key (pk_live_…)",
		"pk_test_TYooMQauvdEDq54NiTphI7jx":   "publishable key (pk_test_…)",
		"whsec_abcdefgh12345678SECRET":       "webhook signing secret",
		"ek_test_YWNjdF8xTTJKVGtMa2RJd0h1":   "ephemeral key",
		" sk_test_4eC39HqLyjWDarjtT1zdp7dc":  "white space before or after",
		"sk_test_4eC39HqLyjWDarjtT1zdp7dc\n": "white space before or after",
		"sk_test_4eC39Hq LyjWDarjtT1zdp7dc":  "contains white space",
		"sk_test_4eC39Hq-LyjWDarjtT1zdp7dc":  "characters Stripe keys do not have after sk_test_…",
		"sk_test_":                           "characters Stripe keys do not have",
		"garbageGARBAGEgarbage1234":          "does not start like a Stripe API key",
		"Bearer sk_live_51HqLyjWDarjtT1zdp":  "contains white space",
		"":                                   "empty",
	} {
		err := CheckKey(key)
		if !errors.Is(err, ErrKeyKind) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckKey(%q) = %v; want ErrKeyKind naming %q", key, err, want)
			continue
		}
		if !strings.Contains(err.Error(), "sk_live_…, sk_test_…, rk_live_… or rk_test_…") {
			t.Errorf("CheckKey(%q) = %v; want the kinds expected named", key, err)
		}
		if k := strings.TrimSpace(key); len(k) > 8 && strings.Contains(err.Error(), k[8:]) {
			t.Errorf("CheckKey(%q) printed the key: %v", key, err)
		}
	}
}
