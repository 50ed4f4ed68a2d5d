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
	"strconv"
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
	// The scheme's slashes are optional: postgresql:/user:pw@host and
	// postgres:user:pw@host are typos the URL parsers refuse, and their
	// errors echo them.
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*:/{0,3})([^:/@\s"'<>]*):([^@\s"'<>]+)@`), "${1}${2}:" + Mask + "@"},
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
	// key=value and key: value secrets, as in libpq DSNs ("password=...",
	// "sslpassword=..."), query strings, environment dumps (DB_PASSWORD=)
	// and config dumps.
	// A quoted value may lack its closing quote and hold backslash escapes
	// (libpq: password='it\'s'); an unquoted one ends at white space or a
	// query string's & only, since libpq takes , and ; as part of it.
	{regexp.MustCompile(`(?i)\b([a-z0-9_\-]*?(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token))(\s*[=:]\s*)("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|[^\s&"']+)`), "${1}${2}" + Mask},
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

// URL returns a printable form of a connection setting (a URL or a libpq
// keyword/value string) with its secrets masked. A URL that parses has its
// password masked and its user kept. Anything else is a typo whose shape
// nobody can trust (postgresql:/u:pw@h, redis//:pw@h): everything before
// its last '@' is masked, since that is where a password sits whatever the
// slashes; a keyword/value string has its password= values masked.
func URL(raw string) string {
	if u, ok := wellFormed(raw); ok {
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
	if at := strings.LastIndexByte(raw, '@'); at >= 0 && !keywordValue.MatchString(raw) {
		scheme := schemePrefix.FindString(raw)
		return String(scheme + Mask + raw[at:])
	}
	return String(raw)
}

var (
	// schemePrefix is how a connection URL starts, slashes or not.
	schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*:/*`)
	// keywordValue is a libpq keyword/value string: "host=db password=…".
	keywordValue = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)
	// secretValue finds the value of a password-like key in a query
	// string or a keyword/value string.
	secretValue = regexp.MustCompile(`(?i)(?:^|[\s?&;])[a-z_]*(?:password|secret)\s*=\s*('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?|[^\s&]*)`)
)

// Misplaced reports whether the connection URL raw has a userinfo that a
// URL parser will not read as one: a '@' outside the authority, as in
// postgres:///:pw@db or redis://:12#pw@host. The parser then takes the
// password for a path, a database name or a fragment, and the server's
// errors quote it back ("database \":pw@db\" does not exist"). Keyword/value
// strings and URLs without '@' are never misplaced.
//
// A userinfo holding a second, unencoded '@' is misplaced too, although
// Go's URL parser splits at the last one: pgx splits at the first
// (postgres://u:s3cret@P4ss@db names the host "P4ss@db" and quotes it in
// every "waiting for Postgres" line), and a proxy or another client of the
// same URL may do either.
func Misplaced(raw string) bool {
	if !strings.Contains(raw, "@") || keywordValue.MatchString(raw) {
		return false
	}
	u, ok := wellFormed(raw)
	return !ok || (u.User != nil && strings.Count(authority(raw), "@") > 1)
}

// authority is the text between a URL's "//" and the path, query or
// fragment that follows.
func authority(raw string) string {
	_, rest, ok := strings.Cut(raw, "//")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// wellFormed parses raw as a URL with an authority holding its whole
// userinfo (the host may be empty: postgres://u:pw@/db?host=/run/pg): a '@' anywhere else means the parser split the string
// somewhere the user did not mean, and the password may sit in the host,
// the path or the fragment.
func wellFormed(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || (u.Host == "" && u.User == nil) || u.Opaque != "" {
		return nil, false
	}
	rest := *u
	rest.User = nil
	if strings.Contains(rest.String(), "@") || strings.ContainsAny(raw, " \t\r\n") {
		return nil, false
	}
	return u, true
}

// Scrub returns s, a message that may quote the setting raw (a library's
// error about it), with raw and its secrets masked: raw itself in any form
// a message quotes it (verbatim, Go-quoted, percent-decoded) becomes
// URL(raw), and each secret raw holds (see secretsOf) is masked, as are its
// pieces between URL delimiters, since a parser that split the string
// wrongly quotes a piece. Then String.
func Scrub(s, raw string) string {
	if raw == "" {
		return String(s)
	}
	printable := URL(raw)
	for _, v := range forms(raw) {
		if len(v) >= 3 {
			s = strings.ReplaceAll(s, v, printable)
		}
	}
	for _, secret := range secretsOf(raw) {
		for _, v := range forms(secret) {
			s = maskAll(s, v, 3)
		}
		for _, piece := range strings.FieldsFunc(secret, isDelimiter) {
			for _, v := range forms(piece) {
				s = maskAll(s, v, 4)
			}
		}
	}
	return String(s)
}

// ScrubError is Error with Scrub: err's message with the setting raw and
// its secrets masked; errors.Is and errors.As still see the original chain.
func ScrubError(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Scrub(msg, raw); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

// secretsOf returns the secrets in a connection setting: the password of a
// URL; for a malformed one, what stands between its scheme and its last
// '@' (and the part after the first ':' of that); the values of
// password-like keys.
func secretsOf(raw string) []string {
	var out []string
	if u, ok := wellFormed(raw); ok {
		if pw, has := u.User.Password(); has {
			out = append(out, pw)
		}
	} else if at := strings.LastIndexByte(raw, '@'); at >= 0 && !keywordValue.MatchString(raw) {
		userinfo := raw[len(schemePrefix.FindString(raw)):at]
		out = append(out, userinfo)
		if _, pw, ok := strings.Cut(userinfo, ":"); ok {
			out = append(out, pw)
		}
	}
	for _, m := range secretValue.FindAllStringSubmatch(raw, -1) {
		v := m[1]
		out = append(out, v, strings.Trim(v, `'"`))
	}
	return out
}

// forms are the ways a message may quote v: verbatim, inside Go quotes
// (%q), percent-decoded.
func forms(v string) []string {
	out := []string{v}
	if q := strconv.Quote(v); q[1:len(q)-1] != v {
		out = append(out, q[1:len(q)-1])
	}
	if d, err := url.PathUnescape(v); err == nil && d != v {
		out = append(out, d)
	}
	if d, err := url.QueryUnescape(v); err == nil && d != v {
		out = append(out, d)
	}
	return out
}

// maskAll masks every occurrence of v in s when v is at least min bytes:
// shorter pieces are not secrets, and masking them would garble the
// message.
func maskAll(s, v string, min int) string {
	if len(v) < min || v == Mask {
		return s
	}
	return strings.ReplaceAll(s, v, Mask)
}

func isDelimiter(r rune) bool {
	return strings.ContainsRune(":/?#[]@&='\" \t\r\n\\", r)
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
