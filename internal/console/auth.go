package console

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pelguard/pelguard/internal/pg"
)

// LoadUsers reads a users file: one `name:hash` a line, the hash bcrypt's
// ($2a$, $2b$, $2y$: what `htpasswd -nB name` prints); # starts a comment.
// A name may hold letters, digits and . _ @ -: it is what every recorded
// action says.
func LoadUsers(r io.Reader) (map[string][]byte, error) {
	users := map[string][]byte{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok || !validUser(name) {
			return nil, fmt.Errorf("users file line %d: want name:bcrypt-hash with a name of letters, digits and . _ @ -", n)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("users file line %d (%s): not a bcrypt hash (make one with `htpasswd -nB %s`)", n, name, name)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("users file line %d: %s is listed twice", n, name)
		}
		users[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the users file: %w", err)
	}
	if len(users) == 0 {
		return nil, errors.New("the users file lists nobody")
	}
	return users, nil
}

func validUser(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._@-", r)) {
			return false
		}
	}
	return true
}

const sessionCookie = "pelguard_console"

// authenticator knows who a request is from. Sessions live in Postgres
// (console_sessions, the cookie's token hashed), so a restart or another
// replica keeps them; so do the login throttle and the key that signs
// action tokens (sessions.go).
type authenticator struct {
	cfg   Config
	store *sessionStore
	// dummy is compared against for unknown users, so a login takes as long
	// whether or not the name exists.
	dummy []byte
}

func newAuthenticator(cfg Config, db pg.DB) (*authenticator, error) {
	a := &authenticator{cfg: cfg, store: &sessionStore{db: db}}
	var err error
	if a.dummy, err = bcrypt.GenerateFromPassword([]byte("no such user"), dummyCost(cfg.Users)); err != nil {
		return nil, err
	}
	return a, nil
}

// dummyCost is the highest cost among the users' hashes: the dummy must
// cost what a real user's check costs, or an unknown name answers faster
// (a cost-10 dummy against `hash-password`'s cost 12: 0.06 s against
// 0.25 s) and names can be enumerated.
func dummyCost(users map[string][]byte) int {
	c := bcrypt.DefaultCost
	for _, h := range users {
		if hc, err := bcrypt.Cost(h); err == nil && hc > c {
			c = hc
		}
	}
	return c
}

// identity is who a request is from, and the CSRF token its forms carry.
// A proxy user has no session: its token is a MAC of the name and the day
// (the key lives in Postgres and outlives processes), and yesterday's
// (PrevCSRF) is still taken, so a form opened before midnight works after.
type identity struct {
	User     string
	CSRF     string
	PrevCSRF string
}

// csrfOK says whether a submitted CSRF token is the identity's.
func (id identity) csrfOK(tok string) bool {
	ok := subtle.ConstantTimeCompare([]byte(tok), []byte(id.CSRF)) == 1
	if id.PrevCSRF != "" {
		ok = subtle.ConstantTimeCompare([]byte(tok), []byte(id.PrevCSRF)) == 1 || ok
	}
	return ok && tok != ""
}

type ctxKey struct{}

func who(r *http.Request) identity { id, _ := r.Context().Value(ctxKey{}).(identity); return id }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// mac signs parts with the key every replica shares (console_keys).
func (a *authenticator) mac(ctx context.Context, parts ...string) (string, error) {
	key, err := a.store.signingKey(ctx)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil)), nil
}

// errNotTrusted: a proxy-user request that did not come from a trusted
// proxy.
var errNotTrusted = errors.New("the request did not come through a trusted proxy")

// errTwoUsers: a proxy-user request with more than one user header.
var errTwoUsers = errors.New("more than one user header")

// identify returns the request's identity; ok false means nobody (log in).
func (a *authenticator) identify(r *http.Request, now time.Time) (identity, bool, error) {
	if a.cfg.ProxyUserHeader != "" {
		if !a.trusted(r.RemoteAddr) {
			return identity{}, false, errNotTrusted
		}
		// Two user headers (one the client's, one the proxy's, or the
		// client's twice through a proxy that appends): which one is the
		// proxy's cannot be told, so neither is believed.
		if vs := r.Header.Values(a.cfg.ProxyUserHeader); len(vs) > 1 || len(vs) == 1 && strings.Contains(vs[0], ",") {
			return identity{}, false, errTwoUsers
		}
		user := strings.TrimSpace(r.Header.Get(a.cfg.ProxyUserHeader))
		if !validUser(user) {
			return identity{}, false, nil
		}
		day := now.UTC().Format(time.DateOnly)
		csrf, err := a.mac(r.Context(), "csrf", user, day)
		if err != nil {
			return identity{}, false, err
		}
		prev, err := a.mac(r.Context(), "csrf", user, now.UTC().AddDate(0, 0, -1).Format(time.DateOnly))
		if err != nil {
			return identity{}, false, err
		}
		return identity{User: user, CSRF: csrf, PrevCSRF: prev}, true, nil
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return identity{}, false, nil
	}
	return a.store.get(r.Context(), c.Value, now)
}

func (a *authenticator) trusted(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	for _, p := range a.cfg.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// check verifies a login; it takes bcrypt's time whether or not the user
// exists.
func (a *authenticator) check(user, password string) bool {
	hash, ok := a.cfg.Users[user]
	if !ok {
		_ = bcrypt.CompareHashAndPassword(a.dummy, []byte(password))
		return false
	}
	return bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil
}

func (a *authenticator) endSession(r *http.Request) error {
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		return a.store.end(r.Context(), c.Value)
	}
	return nil
}

// actionToken is the one-time token of a confirmation form: a nonce and a
// MAC binding it to the user, the action and its target, so a POST must
// come from a confirmation page this server rendered for that person and
// that action. console_actions.token is UNIQUE: the second submit of one
// form finds the first's row.
func (a *authenticator) actionToken(ctx context.Context, user, action, target string) (string, error) {
	nonce := randomHex(16)
	m, err := a.mac(ctx, "action", nonce, user, action, target)
	if err != nil {
		return "", err
	}
	return nonce + "." + m[:32], nil
}

func (a *authenticator) validToken(ctx context.Context, tok, user, action, target string) bool {
	nonce, mac, ok := strings.Cut(tok, ".")
	if !ok || len(nonce) != 32 {
		return false
	}
	want, err := a.mac(ctx, "action", nonce, user, action, target)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(mac), []byte(want[:32])) == 1
}

// sameOrigin refuses a POST whose Origin (or, without one, Referer) names
// another site: a second line behind the CSRF token and SameSite=Strict.
func sameOrigin(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
	}
	if src == "" {
		return true // a client that sends neither is not a browser on another site
	}
	u, err := url.Parse(src)
	return err == nil && u.Host == r.Host
}

// authed wraps a page: nobody is sent to the login page (401 for a proxy
// user without the header; 403 from an untrusted address).
func (s *Server) authed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok, err := s.auth.identify(r, s.now())
		switch {
		case errors.Is(err, errNotTrusted):
			http.Error(w, "forbidden: this console believes user headers only from its trusted proxies", http.StatusForbidden)
			return
		case errors.Is(err, errTwoUsers):
			http.Error(w, "bad request: more than one user header; the proxy must send exactly one (and drop the client's)", http.StatusBadRequest)
			return
		case err != nil:
			s.fail(w, r, err)
			return
		case !ok && s.cfg.ProxyUserHeader != "":
			http.Error(w, "unauthenticated: no user header from the proxy", http.StatusUnauthorized)
			return
		case !ok:
			if r.Method != http.MethodGet {
				http.Error(w, "unauthenticated", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, id)))
	})
}

// action wraps an action's POST: a known person, same origin, the
// session's CSRF token, and --allow-actions. Anything else changes nothing.
func (s *Server) action(h http.HandlerFunc) http.Handler {
	return s.authed(func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.AllowActions {
			http.Error(w, "forbidden: the console is read-only (start it with --allow-actions)", http.StatusForbidden)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		if !sameOrigin(r) || !who(r).csrfOK(r.PostFormValue("csrf")) {
			http.Error(w, "forbidden: missing or wrong CSRF token (reload the page)", http.StatusForbidden)
			return
		}
		h(w, r)
	})
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.ProxyUserHeader != "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "login", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.cfg.ProxyUserHeader != "" {
		http.Error(w, "log in at the proxy", http.StatusNotFound)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if err := r.ParseForm(); err != nil || !sameOrigin(r) {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	user, next := truncate(strings.TrimSpace(r.PostFormValue("user")), 64), safeNext(r.PostFormValue("next"))
	data := map[string]any{"Next": next, "User": user}
	if user == "" || r.PostFormValue("password") == "" {
		data["Error"] = "give your name and your password"
		s.render(w, r, http.StatusUnprocessableEntity, "login", data)
		return
	}
	addr := clientAddr(r, s.cfg.TrustedProxies)
	ctx := r.Context()
	ids, err := s.auth.store.attempt(ctx, s.throttle(), user, addr, s.now())
	var lo *lockedOut
	if errors.As(err, &lo) {
		s.log.Warn("console login refused: too many failures", "user", user, "remote", addr, "scope", lo.Scope, "until", lo.Until)
		wait := lo.Until.Sub(s.now())
		w.Header().Set("Retry-After", strconv.Itoa(int(max(wait.Round(time.Second), time.Second)/time.Second)))
		what := "this name"
		if lo.Scope == scopeAddr {
			what = "your address"
		}
		data["Error"] = fmt.Sprintf("Too many failed logins for %s: try again after %s (in %s). Nothing was checked.",
			what, lo.Until.UTC().Format("15:04:05 UTC"), span(wait))
		s.render(w, r, http.StatusTooManyRequests, "login", data)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.auth.check(user, r.PostFormValue("password")) {
		s.log.Warn("console login failed", "user", user, "remote", addr)
		data["Error"] = "wrong name or password"
		s.render(w, r, http.StatusUnauthorized, "login", data)
		return
	}
	if err := s.auth.store.succeeded(ctx, user, ids); err != nil {
		s.fail(w, r, err)
		return
	}
	tok, err := s.auth.store.create(ctx, user, addr, s.now(), s.cfg.SessionTTL)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: tok, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookies || r.TLS != nil,
		MaxAge: int(s.cfg.SessionTTL / time.Second)})
	s.log.Info("console login", "user", user, "remote", addr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) throttle() throttle {
	return throttle{Window: s.cfg.LoginWindow, MaxUser: s.cfg.MaxLoginFailuresPerUser, MaxAddr: s.cfg.MaxLoginFailuresPerAddr}
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || !who(r).csrfOK(r.PostFormValue("csrf")) {
		http.Error(w, "forbidden: missing or wrong CSRF token", http.StatusForbidden)
		return
	}
	if err := s.auth.endSession(r); err != nil {
		s.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect on this site: it returns next when
// next is a plain path on this origin (with a query or fragment), else "/".
// A browser reads a Location more loosely than url.Parse: it drops tab, CR
// and LF anywhere, trims leading and trailing control characters and
// spaces, and takes a backslash for a slash, so "/\t/evil.example" and
// "/\\evil.example" both reach //evil.example, another host. Rather than
// replay that normalisation, anything it would touch is refused outright (a
// real path percent-encodes such bytes), and so are the shapes that leave
// the path: a scheme, an authority, a leading "//". The decoded path is
// checked too (no encoded slash, backslash or control character, no dot
// segment), so that this server, decoding it on the next request, never
// sees a path that starts "//" either.
func safeNext(next string) string {
	if next == "" || next[0] != '/' || strings.ContainsAny(next, "\\") || strings.HasPrefix(next, "//") {
		return "/"
	}
	if strings.ContainsFunc(next, func(r rune) bool { return r == ' ' || control(r) }) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return "/"
	}
	if strings.HasPrefix(u.Path, "//") || strings.ContainsRune(u.Path, '\\') || strings.ContainsFunc(u.Path, control) {
		return "/"
	}
	for _, seg := range strings.Split(u.Path, "/")[1:] {
		if seg == "." || seg == ".." {
			return "/"
		}
	}
	return next
}

// control reports the characters a browser may drop or trim from a URL,
// and the invisible ones nobody types into a path: C0 and C1 controls,
// DEL, line and paragraph separators, the byte-order mark.
func control(r rune) bool {
	return r < ' ' || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == '\u2028' || r == '\u2029' || r == '\ufeff'
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
