package console

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Careless input: every query and form parameter is checked before any
// page reads it (the login form included, before any login), so a NUL
// byte or a byte sequence that is not UTF-8 is refused with a message of
// ours instead of reaching Postgres or Redis and coming back as a 500
// with their error text.

// maxForm bounds a form's body (the login form less).
const (
	maxForm      = 16 << 10
	maxLoginForm = 8 << 10
)

// badInput is why a request's parameters are refused, "" when they are
// fine. It parses the query and, for a POST, the urlencoded body (bounded).
func badInput(w http.ResponseWriter, r *http.Request) string {
	if r.Method == http.MethodPost && r.Body != nil {
		limit := int64(maxForm)
		if r.URL.Path == "/login" {
			limit = maxLoginForm
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	if err := r.ParseForm(); err != nil {
		return "the query or the form could not be read (a malformed %-escape, or too long)"
	}
	for k, vs := range r.Form {
		if bad := badText(k); bad != "" {
			return fmt.Sprintf("a parameter's name %s", bad)
		}
		for _, v := range vs {
			if bad := badText(v); bad != "" {
				return fmt.Sprintf("parameter %q %s", k, bad)
			}
		}
	}
	return ""
}

// badText says what is wrong with s as text, "" when nothing is.
func badText(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "holds a NUL byte"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// streamIDPattern is a Redis stream entry id: milliseconds, and a
// sequence number (optional in a range bound).
var streamIDPattern = regexp.MustCompile(`^[0-9]{1,20}(-[0-9]{1,20})?$`)

// validStreamID reports whether id is a stream entry id ("" is: none).
func validStreamID(id string) bool {
	return id == "" || streamIDPattern.MatchString(id)
}

// refuseStreamID answers 400 for a malformed stream entry id in param.
func refuseStreamID(w http.ResponseWriter, param, id string) bool {
	if validStreamID(id) {
		return false
	}
	http.Error(w, fmt.Sprintf("bad request: %s %q is not a stream entry id (like 1764806400000-0)", param, truncate(id, 60)), http.StatusBadRequest)
	return true
}
