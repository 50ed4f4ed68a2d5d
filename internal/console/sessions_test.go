package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// replica is another console Server over the bundle's database, as a
// second replica or the same one restarted.
func (b *bundle) replica(t *testing.T) *httptest.Server {
	t.Helper()
	s, err := New(b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

// at sends c's requests (its cookies: a jar is per host, not per port) to
// another server.
func (c *client) at(srv *httptest.Server) *client {
	b := *c.b
	b.srv = srv
	return &client{t: c.t, b: &b, hc: c.hc}
}

func (c *client) loginAs(user, password string) response {
	c.t.Helper()
	return c.post("/login", url.Values{"user": {user}, "password": {password}, "next": {"/"}})
}

// A session made on one replica is good on another and after a restart; a
// confirmation page one replica rendered is accepted by the other; a
// logout on one ends it everywhere; the cookie's token is not what the
// table holds.
func TestSessionsSharedByReplicasAndRestarts(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, dup, fid := b.duplicate(t, "c1", 2500)
	c := b.login(t, "alice")
	second := b.replica(t)
	if r := c.at(second).get("/"); r.code != http.StatusOK || !strings.Contains(r.body, "alice") {
		t.Fatalf("the second replica does not know the session: %d %s", r.code, r.location)
	}
	// A form from the first replica, submitted to the second.
	v := form(t, c.mustGet(fmt.Sprintf("/findings/%d/confirm?action=refund", fid)))
	v.Set("reason", "charged twice (ticket 12)")
	if r := c.at(second).post(fmt.Sprintf("/findings/%d/refund", fid), v); r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/actions/") {
		t.Fatalf("the second replica refused the first's form: %d %s", r.code, r.body)
	}
	if ch, _ := b.sim.Charge(dup); ch.AmountRefunded != 2500 || b.refundPosts() != 1 {
		t.Fatalf("refunded %d in %d refunds", ch.AmountRefunded, b.refundPosts())
	}
	// A restart: the first replica gone, a new one on the same database.
	b.srv.Close()
	restarted := b.replica(t)
	if r := c.at(restarted).get("/"); r.code != http.StatusOK {
		t.Fatalf("a restart logged alice out: %d %s", r.code, r.location)
	}
	var cookie string
	u, _ := url.Parse(restarted.URL)
	for _, ck := range c.hc.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			cookie = ck.Value
		}
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_sessions WHERE encode(token_hash, 'hex') = $1 OR csrf = $1`, cookie); n != 0 || cookie == "" {
		t.Errorf("the table holds the cookie's token (%q)", cookie)
	}
	// A logout on the second ends the session on the restarted one too.
	page := c.at(second).mustGet("/")
	if r := c.at(second).post("/logout", url.Values{"csrf": form(t, page)["csrf"]}); r.code != http.StatusSeeOther {
		t.Fatalf("logout: %d", r.code)
	}
	if r := c.at(restarted).get("/"); r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/login") {
		t.Fatalf("logged out on one replica, still in on another: %d", r.code)
	}
}

// A session ends at its TTL on the console's clock, and the next login
// deletes the expired rows.
func TestSessionsExpireAndArePruned(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.SessionTTL = time.Hour })
	c := b.login(t, "alice")
	b.clk.Advance(59 * time.Minute)
	c.mustGet("/")
	b.clk.Advance(time.Minute)
	if r := c.get("/"); r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/login") {
		t.Fatalf("an expired session still serves: %d", r.code)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_sessions`); n != 1 {
		t.Fatalf("%d sessions before the next login, want the expired one", n)
	}
	b.login(t, "bob")
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_sessions WHERE expires_at <= $1`, b.clk.Now()); n != 0 {
		t.Fatalf("%d expired sessions left after a login", n)
	}
}

// Five wrong passwords for a name: the sixth attempt is refused even with
// the right password (429, saying when to retry), on every replica, until
// the window has passed on the console's clock; then the right password
// works and resets the count. Another name from the same address is not
// locked out.
func TestLoginLockedOutAfterFiveFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	second := b.replica(t)
	c := b.anon(t)
	for i := range 5 {
		cl := c
		if i%2 == 1 {
			cl = c.at(second)
		}
		if r := cl.loginAs("alice", "wrong"); r.code != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d", i+1, r.code)
		}
		b.clk.Advance(time.Minute)
	}
	// 5 failures at 12:00 … 12:04; now 12:05. The oldest leaves the window
	// at 12:15.
	for _, cl := range []*client{c, c.at(second)} {
		r := cl.loginAs("alice", testPassword)
		if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "try again after 12:15:00 UTC") || r.header.Get("Retry-After") != "600" {
			t.Fatalf("the right password after 5 failures: %d Retry-After %q\n%s", r.code, r.header.Get("Retry-After"), r.body)
		}
		if !strings.Contains(r.body, `value="alice"`) {
			t.Error("the refused login form lost the name")
		}
	}
	if r := c.loginAs("bob", testPassword); r.code != http.StatusSeeOther {
		t.Fatalf("another name from the same address: %d", r.code)
	}
	b.clk.Advance(9*time.Minute + 59*time.Second) // 12:14:59
	if r := c.loginAs("alice", testPassword); r.code != http.StatusTooManyRequests {
		t.Fatalf("a second before the window passed: %d", r.code)
	}
	b.clk.Advance(time.Second) // 12:15: 4 failures left in the window
	if r := c.loginAs("alice", testPassword); r.code != http.StatusSeeOther {
		t.Fatalf("after the window: %d %s", r.code, r.body)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_login_attempts WHERE scope = 'user' AND key = 'alice'`); n != 0 {
		t.Fatalf("a successful login left %d of alice's failures", n)
	}
	// Reset: four more failures do not lock her out.
	for range 4 {
		c.loginAs("alice", "wrong")
	}
	if r := c.loginAs("alice", testPassword); r.code != http.StatusSeeOther {
		t.Fatalf("4 failures after a reset: %d", r.code)
	}
}

// Guesses sent at once are counted one by one: of twelve parallel wrong
// passwords for one name, five are checked and seven refused.
func TestLoginParallelGuessesCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	second := b.replica(t)
	codes := make([]int, 12)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			c := b.anon(t)
			if i%2 == 1 {
				c = c.at(second)
			}
			req, _ := http.NewRequest(http.MethodPost, c.b.srv.URL+"/login",
				strings.NewReader(url.Values{"user": {"alice"}, "password": {fmt.Sprint("guess", i)}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := c.hc.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	n := map[int]int{}
	for _, code := range codes {
		n[code]++
	}
	if n[http.StatusUnauthorized] != 5 || n[http.StatusTooManyRequests] != 7 {
		t.Fatalf("answers %v, want 5 × 401 and 7 × 429", n)
	}
}

// An address that failed too often is refused for every name; behind a
// trusted proxy the address is the client's (X-Forwarded-For), not the
// proxy's.
func TestLoginLockedOutByAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.MaxLoginFailuresPerAddr = 3
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	c := b.anon(t)
	try := func(user, password, from string) response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/login", strings.NewReader(url.Values{"user": {user}, "password": {password}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-For", from)
		return c.do(req)
	}
	for _, u := range []string{"mallory", "eve", "trent"} {
		if r := try(u, "x", "203.0.113.9"); r.code != http.StatusUnauthorized {
			t.Fatalf("%s: %d", u, r.code)
		}
	}
	r := try("alice", testPassword, "203.0.113.9")
	if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "your address") {
		t.Fatalf("the 4th name from one address: %d\n%s", r.code, r.body)
	}
	if r := try("alice", testPassword, "198.51.100.7"); r.code != http.StatusSeeOther {
		t.Fatalf("another client behind the same proxy: %d", r.code)
	}
	// alice's success did not reset the address's count.
	if r := try("bob", testPassword, "203.0.113.9"); r.code != http.StatusTooManyRequests {
		t.Fatalf("the locked address after another's success: %d", r.code)
	}
}

func TestClientAddr(t *testing.T) {
	t.Parallel()
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct{ remote, xff, want string }{
		{"203.0.113.9:5000", "", "203.0.113.9"},
		{"203.0.113.9:5000", "1.2.3.4", "203.0.113.9"}, // not from a trusted proxy: the header is ignored
		{"10.0.0.5:5000", "198.51.100.7", "198.51.100.7"},
		{"10.0.0.5:5000", "6.6.6.6, 198.51.100.7, 10.0.0.4", "198.51.100.7"}, // the nearest untrusted hop
		{"10.0.0.5:5000", "", "10.0.0.5"},
		{"10.0.0.5:5000", "garbage", "10.0.0.5"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/login", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := clientAddr(r, trusted); got != tc.want {
			t.Errorf("%s via %q: %s, want %s", tc.remote, tc.xff, got, tc.want)
		}
	}
}

// A proxy user's CSRF token (no session to hold one) is a MAC of the name
// and the day with the key every replica shares: a form is good on another
// replica, the day after it was opened, and not the day after that.
func TestProxyUserCSRFTokenLastsADay(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.Users, c.ProxyUserHeader, c.TrustedProxies = nil, "X-Forwarded-User", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	_, _, fid := b.duplicate(t, "c1", 2500)
	second := b.replica(t)
	c := b.anon(t)
	send := func(srv *httptest.Server, method, path string, v url.Values) response {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(v.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-User", "carol")
		return c.do(req)
	}
	confirm := fmt.Sprintf("/findings/%d/confirm?action=dismiss", fid)
	stale := form(t, send(b.srv, http.MethodGet, confirm, nil).body)
	stale.Set("reason", "not ours")
	b.clk.Advance(48 * time.Hour)
	if r := send(second, http.MethodPost, fmt.Sprintf("/findings/%d/dismiss", fid), stale); r.code != http.StatusForbidden {
		t.Fatalf("a form two days old: %d", r.code)
	}
	fresh := form(t, send(b.srv, http.MethodGet, confirm, nil).body)
	fresh.Set("reason", "not ours")
	b.clk.Advance(24 * time.Hour)
	if r := send(second, http.MethodPost, fmt.Sprintf("/findings/%d/dismiss", fid), fresh); r.code != http.StatusSeeOther {
		t.Fatalf("yesterday's form on another replica: %d %s", r.code, r.body)
	}
	if n := b.count(t, `SELECT count(*) FROM {schema}.console_actions WHERE actor = 'carol' AND outcome = 'done'`); n != 1 {
		t.Fatalf("%d actions done, want 1", n)
	}
}
