// Package redact removes secrets from text before it reaches a log line, an
// error, a metric label, an alert or --help output (invariant 7). It is the
// ONE redaction function of pelguard: the log handler (internal/cli), the
// error printer (cli.Fail), the usage printer (cli.NewFlagSet) and every
// alert text (alerts.Redact is this function) go through String. It is
// deliberately pattern-based: a secret that slips into an error string from a
// library is caught here too.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask is what a secret is replaced with.
const Mask = "[REDACTED]"

// rule is one pattern and what replaces it. Rules apply in order: URLs
// first, so that a token inside a URL goes with the URL.
type rule struct {
	re   *regexp.Regexp
	repl string
}

var rules = []rule{
	// Slack incoming webhooks carry their secret in the path: anyone holding
	// one can post.
	{regexp.MustCompile(`(?i)https?://hooks\.slack(?:-gov)?\.com/[^\s"'<>|)]*`), "https://hooks.slack.com/" + Mask},
	// user:password@ in any URL (postgres://, postgresql://, redis://,
	// rediss://, amqp://, ...). The user name stays: it helps debugging and
	// is not a secret.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)([^:/@\s"'<>]*):([^@\s"'<>]+)@`), "${1}${2}:" + Mask + "@"},
	// Stripe secret, restricted and publishable keys (live or test), webhook
	// signing secrets, ephemeral keys.
	{regexp.MustCompile(`\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]+`), Mask},
	{regexp.MustCompile(`\b(?:whsec|ek_live|ek_test)_[0-9A-Za-z]+`), Mask},
	// PaymentIntent / SetupIntent client secrets: pi_123_secret_abc. The
	// intent id stays readable.
	{regexp.MustCompile(`\b((?:pi|seti)_[0-9A-Za-z]+)_secret_[0-9A-Za-z]+`), "${1}_secret_" + Mask},
	// Slack tokens: bot, user, app-level, configuration and refresh tokens.
	{regexp.MustCompile(`\bxox[a-z](?:\.xox[a-z])?-[0-9A-Za-z\-]+`), Mask},
	{regexp.MustCompile(`\bxapp-[0-9A-Za-z\-]+`), Mask},
	// Authorization headers echoed into error strings or dumps.
	{regexp.MustCompile(`(?i)\b(bearer|basic)\s+[0-9A-Za-z._~+/=\-]{8,}`), "${1} " + Mask},
	// key=value and key: value secrets, as in libpq DSNs ("password=..."),
	// query strings and config dumps.
	{regexp.MustCompile(`(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret)(\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&,;"']+)`), "${1}${2}" + Mask},
}

// panCandidates find digit runs that could be a card number: 15 to 19
// digits in one run, or 13 to 19 grouped the way people type them
// (4242 4242 4242 4242, 3782-822463-10005). Shorter plain runs are left
// alone: 13-digit millisecond timestamps and stream IDs are everywhere in
// pelguard's logs and alerts.
var panCandidates = []*regexp.Regexp{
	regexp.MustCompile(`\b\d{15,19}\b`),
	regexp.MustCompile(`\b\d{4}[ \-]\d{4,6}[ \-]\d{4,5}(?:[ \-]\d{1,4})?\b`),
}

// String returns s with every secret it recognises replaced by Mask:
// Stripe keys (sk_/rk_/pk_ live and test, webhook secrets, ephemeral keys,
// client secrets), Slack tokens (xoxb-, xoxp-, xoxa-, xoxs-, xapp-), Slack
// incoming-webhook URLs, passwords in URLs such as postgres:// or redis://,
// password=/secret=/api_key= assignments, bearer credentials, and anything
// that passes the Luhn check as a 13-19 digit card number. It is
// idempotent.
func String(s string) string {
	if s == "" {
		return s
	}
	for _, r := range rules {
		s = r.re.ReplaceAllString(s, r.repl)
	}
	for _, re := range panCandidates {
		s = redactCards(s, re)
	}
	return s
}

// URL returns a printable form of a connection URL with its password masked.
// Unparseable input is redacted as text.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return String(raw)
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	for k := range q {
		if strings.EqualFold(k, "password") {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return String(strings.ReplaceAll(u.String(), "xxxxx", Mask))
}

// Error wraps err so that its message is redacted while errors.Is and
// errors.As still see the original chain.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := String(msg); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

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
		b.WriteString(Mask)
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
