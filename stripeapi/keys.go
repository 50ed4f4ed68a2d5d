package stripeapi

import (
	"errors"
	"regexp"
	"strings"
)

// ErrKeyKind is CheckKey's answer to a string that is not a secret or
// restricted API key.
var ErrKeyKind = errors.New("stripeapi: not a Stripe secret or restricted key")

// apiKey is what Stripe issues as a server-side API key: secret (sk_) or
// restricted (rk_), live or test. The body is Stripe's alphabet; '_' too,
// for the placeholders tests and examples use (sk_test_pelguard_consumer).
var apiKey = regexp.MustCompile(`^(?:sk|rk)_(?:live|test)_[0-9A-Za-z_]+$`)

// CheckKey refuses, before any call, a key Stripe would answer with a 401
// on every request: the process would start and dead-letter every event.
// The error names the kind of string found and the kind wanted, never the
// key itself.
func CheckKey(key string) error {
	if apiKey.MatchString(key) {
		return nil
	}
	const want = "want a secret or restricted key: sk_live_…, sk_test_…, rk_live_… or rk_test_… (Dashboard → Developers → API keys)"
	var found string
	trimmed := strings.TrimSpace(key)
	switch {
	case key == "":
		found = "the key is empty"
	case trimmed != key && apiKey.MatchString(trimmed):
		found = "the key has white space before or after it (check how it was exported)"
	case strings.ContainsAny(key, " \t\r\n"):
		found = "the key contains white space"
	case hasPrefix(trimmed, "pk_live_", "pk_test_"):
		found = "this is a publishable key (" + trimmed[:8] + "…), which only browsers use"
	case hasPrefix(trimmed, "whsec_"):
		found = "this is a webhook signing secret (whsec_…), not an API key"
	case hasPrefix(trimmed, "ek_live_", "ek_test_"):
		found = "this is an ephemeral key (" + trimmed[:8] + "…), not an API key"
	case hasPrefix(trimmed, "sk_live_", "sk_test_", "rk_live_", "rk_test_"):
		found = "the key has characters Stripe keys do not have after " + trimmed[:8] + "…"
	default:
		found = "the value does not start like a Stripe API key"
	}
	return &keyError{msg: found + ": " + want}
}

func hasPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

type keyError struct{ msg string }

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return ErrKeyKind }
