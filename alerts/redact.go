package alerts

import (
	"regexp"
	"strings"

	"github.com/pelguard/pelguard/internal/redact"
)

// redaction is one pattern and what replaces it. Patterns are applied in
// order: URLs first, so that a token inside a URL is removed with the URL.
type redaction struct {
	re   *regexp.Regexp
	repl string
}

var redactions = []redaction{
	// Incoming-webhook URLs are bearer credentials: anyone holding one can post.
	{regexp.MustCompile(`(?i)https?://hooks\.slack(?:-gov)?\.com/[^\s"'<>|)]*`), "https://hooks.slack.com/[REDACTED]"},
	// user:password@ in any URL (postgres://, postgresql://, redis://, rediss://, amqp://, ...).
	// The user name is kept because it helps debugging and is not a secret.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)([^:/@\s"'<>]*):([^@\s"'<>]+)@`), "${1}${2}:[REDACTED]@"},
	// Stripe secret, restricted and publishable keys, webhook secrets, ephemeral keys.
	{regexp.MustCompile(`\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]+`), "[REDACTED_STRIPE_KEY]"},
	{regexp.MustCompile(`\b(?:whsec|ek_live|ek_test)_[0-9A-Za-z]+`), "[REDACTED_STRIPE_KEY]"},
	// PaymentIntent / SetupIntent client secrets: pi_123_secret_abc.
	{regexp.MustCompile(`\b((?:pi|seti)_[0-9A-Za-z]+)_secret_[0-9A-Za-z]+`), "${1}_secret_[REDACTED]"},
	// Slack tokens: bot, user, app-level, configuration and refresh tokens.
	{regexp.MustCompile(`\bxox[a-z](?:\.xox[a-z])?-[0-9A-Za-z\-]+`), "[REDACTED_SLACK_TOKEN]"},
	{regexp.MustCompile(`\bxapp-[0-9A-Za-z\-]+`), "[REDACTED_SLACK_TOKEN]"},
	// Authorization headers that end up in error strings or dumps.
	{regexp.MustCompile(`(?i)\b(bearer|basic)\s+[0-9A-Za-z._~+/=\-]{8,}`), "${1} [REDACTED]"},
	// key=value and key: value secrets, as in libpq DSNs ("password=..."),
	// query strings and config dumps.
	{regexp.MustCompile(`(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret)(\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&,;"']+)`), "${1}${2}[REDACTED]"},
}

// panCandidates find digit runs that could be a card number: 15 to 19
// digits in one run, or 13 to 19 grouped the way people type them
// (4242 4242 4242 4242, 3782-822463-10005). Shorter plain runs are left
// alone: 13-digit millisecond timestamps and stream IDs are everywhere in
// pelguard's alerts.
var panCandidates = []*regexp.Regexp{
	regexp.MustCompile(`\b\d{15,19}\b`),
	regexp.MustCompile(`\b\d{4}[ \-]\d{4,6}[ \-]\d{4,5}(?:[ \-]\d{1,4})?\b`),
}

// Redact removes secrets from s: Stripe keys (sk_/rk_/pk_ live and test,
// webhook secrets, client secrets), Slack tokens (xoxb-, xoxp-, xoxa-, xoxs-,
// xapp-), Slack incoming-webhook URLs, passwords in URLs such as postgres:// or
// redis://, password=/secret=/api_key= assignments, bearer credentials, and
// anything that passes the Luhn check as a 13-19 digit card number.
//
// It is internal/redact.String plus client secrets, secret=/api_key=
// assignments and card numbers. Every text the alerts package sends or logs passes through it, so that an
// error string that happens to carry a DSN or a key (invariant 7 of the
// design) never reaches Slack.
func Redact(s string) string {
	if s == "" {
		return s
	}
	// The shared patterns first, so alerts never redacts less than the logs;
	// the list below adds what an alert text can carry on top of them.
	s = redact.String(s)
	for _, r := range redactions {
		s = r.re.ReplaceAllString(s, r.repl)
	}
	for _, re := range panCandidates {
		s = redactCards(s, re)
	}
	return s
}

// redactCards replaces the matches of re that pass the Luhn check, except a
// match followed by "-<digit>": that is a Redis stream ID, not a card.
func redactCards(s string, re *regexp.Regexp) string {
	var b strings.Builder
	last := 0
	for _, m := range re.FindAllStringIndex(s, -1) {
		start, end := m[0], m[1]
		if end+1 < len(s) && s[end] == '-' && s[end+1] >= '0' && s[end+1] <= '9' {
			continue
		}
		digits := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, s[start:end])
		if !luhn(digits) {
			continue
		}
		b.WriteString(s[last:start])
		b.WriteString("[REDACTED_CARD]")
		last = end
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// luhn reports whether digits passes the Luhn checksum that every card
// number carries; it keeps long order numbers and timestamps readable.
func luhn(digits string) bool {
	sum := 0
	double := false
	for i := len(digits) - 1; i >= 0; i-- {
		d := int(digits[i] - '0')
		if double {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
		double = !double
	}
	return sum%10 == 0
}
