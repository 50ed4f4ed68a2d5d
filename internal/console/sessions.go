package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pelguard/pelguard/internal/pg"
)

// Sessions, the login throttle and the signing key live in Postgres
// (migration 00016), so that a restart or a second replica keeps everyone
// logged in, accepts a confirmation page another replica rendered, and
// counts the same failed logins.

// Login throttle defaults (Config.LoginWindow, MaxLoginFailuresPerUser,
// MaxLoginFailuresPerAddr).
const (
	DefaultLoginWindow             = 15 * time.Minute
	DefaultMaxLoginFailuresPerUser = 5
	DefaultMaxLoginFailuresPerAddr = 20
)

// Login attempt scopes, as console_login_attempts.scope records them.
const (
	scopeUser = "user"
	scopeAddr = "addr"
)

// keyName is console_keys' row of the action-token key.
const keyName = "action-tokens"

// sessionStore is the console's Postgres tables of sessions and attempts.
type sessionStore struct {
	db pg.DB

	mu  sync.Mutex
	key []byte // console_keys' key, read once
}

func hashToken(tok string) []byte { h := sha256.Sum256([]byte(tok)); return h[:] }

// signingKey is the key every replica signs action tokens with: made by the
// first replica that needs one, read by the others.
func (st *sessionStore) signingKey(ctx context.Context) ([]byte, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.key != nil {
		return st.key, nil
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	if _, err := st.db.Exec(ctx, `INSERT INTO {schema}.console_keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`,
		keyName, k); err != nil {
		return nil, fmt.Errorf("making the console's signing key: %w", err)
	}
	if err := st.db.QueryRow(ctx, `SELECT key FROM {schema}.console_keys WHERE name = $1`, keyName).Scan(&k); err != nil {
		return nil, fmt.Errorf("reading the console's signing key: %w", err)
	}
	st.key = k
	return k, nil
}

// create stores a new session of user and returns its cookie token;
// expired sessions go at each login.
func (st *sessionStore) create(ctx context.Context, user, remote string, now time.Time, ttl time.Duration) (string, error) {
	tok := randomHex(32)
	if _, err := st.db.Exec(ctx, `DELETE FROM {schema}.console_sessions WHERE expires_at <= $1`, now); err != nil {
		return "", fmt.Errorf("pruning expired console sessions: %w", err)
	}
	if _, err := st.db.Exec(ctx, `INSERT INTO {schema}.console_sessions (token_hash, username, csrf, created_at, expires_at, remote_addr)
		VALUES ($1, $2, $3, $4, $5, $6)`, hashToken(tok), user, randomHex(32), now, now.Add(ttl), remote); err != nil {
		return "", fmt.Errorf("storing the console session: %w", err)
	}
	return tok, nil
}

// get returns the live session of a cookie token; ok false: none (never
// made, logged out, or expired).
func (st *sessionStore) get(ctx context.Context, tok string, now time.Time) (identity, bool, error) {
	var id identity
	err := st.db.QueryRow(ctx, `SELECT username, csrf FROM {schema}.console_sessions WHERE token_hash = $1 AND expires_at > $2`,
		hashToken(tok), now).Scan(&id.User, &id.CSRF)
	if errors.Is(err, pgx.ErrNoRows) {
		return id, false, nil
	}
	if err != nil {
		return id, false, fmt.Errorf("reading the console session: %w", err)
	}
	return id, true, nil
}

func (st *sessionStore) end(ctx context.Context, tok string) error {
	_, err := st.db.Exec(ctx, `DELETE FROM {schema}.console_sessions WHERE token_hash = $1`, hashToken(tok))
	return err
}

// throttle is the login rate limit: at most MaxUser failed logins of one
// name and MaxAddr of one address in any Window.
type throttle struct {
	Window           time.Duration
	MaxUser, MaxAddr int
}

// lockedOut says when a refused login may be tried again.
type lockedOut struct {
	Scope string // scopeUser or scopeAddr
	Until time.Time
}

func (e *lockedOut) Error() string {
	return fmt.Sprintf("too many failed logins for this %s", e.Scope)
}

// attempt records a login attempt of user from addr before its password is
// checked, under one transaction-scoped advisory lock per name and address
// (so parallel guesses are counted one by one, on every replica). It
// returns the attempt's rows, to forget when the password was right, or a
// *lockedOut when the name or the address already failed too often in the
// window: then nothing is recorded and the password is not checked.
func (st *sessionStore) attempt(ctx context.Context, th throttle, user, addr string, now time.Time) ([]int64, error) {
	var ids []int64
	since := now.Add(-th.Window)
	err := pgx.BeginFunc(ctx, st.db, func(tx pgx.Tx) error {
		// Old attempts first: the table holds one window's worth.
		if _, err := tx.Exec(ctx, `DELETE FROM {schema}.console_login_attempts WHERE at <= $1`, since); err != nil {
			return err
		}
		for _, sc := range []struct {
			scope, key string
			max        int
		}{{scopeUser, user, th.MaxUser}, {scopeAddr, addr, th.MaxAddr}} {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pelguard-console-login:' || $1 || ':' || $2, 0))`,
				sc.scope, sc.key); err != nil {
				return err
			}
			// The max-th newest attempt in the window: while it is there,
			// the key is locked out; it leaves the window at its time + Window.
			var at time.Time
			err := tx.QueryRow(ctx, `SELECT at FROM {schema}.console_login_attempts WHERE scope = $1 AND key = $2 AND at > $3
				ORDER BY at DESC OFFSET $4 - 1 LIMIT 1`, sc.scope, sc.key, since, sc.max).Scan(&at)
			if err == nil {
				return &lockedOut{Scope: sc.scope, Until: at.Add(th.Window)}
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		for _, sc := range [][2]string{{scopeUser, user}, {scopeAddr, addr}} {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO {schema}.console_login_attempts (scope, key, at) VALUES ($1, $2, $3) RETURNING id`,
				sc[0], sc[1], now).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	var lo *lockedOut
	if errors.As(err, &lo) {
		return nil, lo
	}
	if err != nil {
		return nil, fmt.Errorf("recording a login attempt: %w", err)
	}
	return ids, nil
}

// succeeded forgets a login that was right: this attempt's rows, and every
// earlier failure of the name (a successful login resets its count). The
// address keeps its earlier failures: one account of one's own must not
// reset the count of an address that guesses others' passwords.
func (st *sessionStore) succeeded(ctx context.Context, user string, ids []int64) error {
	_, err := st.db.Exec(ctx, `DELETE FROM {schema}.console_login_attempts WHERE id = ANY($1) OR (scope = 'user' AND key = $2)`, ids, user)
	return err
}

// clientAddr is the address a login is counted against: the peer, or, when
// the peer is one of TrustedProxies, the nearest X-Forwarded-For hop that
// is not (behind a proxy every login would otherwise share the proxy's
// address and its limit).
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	isTrusted := func(s string) bool {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return false
		}
		for _, p := range trusted {
			if p.Contains(ip.Unmap()) {
				return true
			}
		}
		return false
	}
	if !isTrusted(host) {
		return host
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h := strings.TrimSpace(hops[i])
		if _, err := netip.ParseAddr(h); err != nil {
			break // a hop that is no address: stop believing the header here
		}
		if !isTrusted(h) {
			return h
		}
	}
	return host
}
