// Package redact removes secrets from text before it reaches a log line, an
// error, a metric label or an alert (invariant 7). It is deliberately
// pattern-based: a secret that slips into an error string from a library is
// caught here too.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

var patterns = []*regexp.Regexp{
	// Stripe secret, restricted and publishable keys, live or test.
	regexp.MustCompile(`\b(sk|rk|pk)_(live|test)_[0-9A-Za-z]{4,}\b`),
	// Stripe webhook signing secrets.
	regexp.MustCompile(`\bwhsec_[0-9A-Za-z]{8,}\b`),
	// Slack tokens: bot, user, app-level, refresh, legacy workspace.
	regexp.MustCompile(`\bxox[abeoprs]-[0-9A-Za-z-]{8,}`),
	regexp.MustCompile(`\bxapp-[0-9A-Za-z-]{8,}`),
	// Slack incoming webhooks carry their secret in the path.
	regexp.MustCompile(`https://hooks\.slack(-gov)?\.com/[^\s"'<>]+`),
	// Bearer tokens in echoed headers.
	regexp.MustCompile(`(?i)\bbearer\s+[0-9A-Za-z._~+/=-]{8,}`),
}

// userinfo matches scheme://user:password@ so the password can be masked
// without parsing text that is not a URL.
var userinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s"']*):([^@\s"']*)@`)

// password= in libpq key/value connection strings and query strings.
var kvPassword = regexp.MustCompile(`(?i)\b(password|passwd|pwd)=([^\s&"']+)`)

// Mask is what a secret is replaced with.
const Mask = "[REDACTED]"

// String returns s with every secret it recognises replaced by Mask.
func String(s string) string {
	if s == "" {
		return s
	}
	for _, p := range patterns {
		s = p.ReplaceAllString(s, Mask)
	}
	s = userinfo.ReplaceAllString(s, "${1}:"+Mask+"@")
	s = kvPassword.ReplaceAllString(s, "${1}="+Mask)
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
	return strings.ReplaceAll(u.String(), "xxxxx", Mask)
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
