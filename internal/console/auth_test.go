package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/pelguard/pelguard/internal/pg"
)

// nextBypasses are post-login targets that a browser, reading them as a
// Location, takes to another host (or to a page of a scheme of its own).
// Each is the value as the form or the query string delivers it, decoded.
var nextBypasses = []string{
	"//evil.example", "///evil.example", "//evil.example/login",
	`/\evil.example`, `\/evil.example`, `\\evil.example`, `/\/evil.example`,
	"/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "/\t\t/evil.example", "\t//evil.example",
	" //evil.example", "/ /evil.example", "\x00//evil.example", "/\x00/evil.example", "/\x0b/evil.example",
	"/\x7f/evil.example", "/\u0085/evil.example", "/\u2028/evil.example", "/\ufeff/evil.example", "//evil.example\t",
	"/%09/evil.example", "/%0a/evil.example", "/%0D%0A/evil.example", "/%00/evil.example",
	"/%2F%2Fevil.example", "/%2f/evil.example", "/%5Cevil.example", "/%5c%5cevil.example",
	"/./", "/.//evil.example", "/..//evil.example", "/%2e%2e//evil.example", "/a/../..//evil.example",
	"https:evil.example", "https://evil.example", "http:/evil.example", "HTTPS://evil.example", "//user:pw@evil.example",
	"javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "evil.example", "", "?next=//evil.example",
}

// nextKept are this site's own pages, as the login redirect builds them.
var nextKept = []string{
	"/", "/findings", "/findings?status=open&page=2", "/findings/42", "/streams/billing%3Adead?from=1700000000000-0",
	"/events?customer=c_1&q=a%2Fb#top", "/@evil.example", "/https://evil.example",
}

// browserTarget resolves loc the way a browser does before following it:
// leading and trailing C0 controls and spaces trimmed, tab, CR and LF
// dropped anywhere, a backslash read as a slash (WHATWG URL, special
// schemes).
func browserTarget(t *testing.T, base *url.URL, loc string) *url.URL {
	t.Helper()
	loc = strings.TrimFunc(loc, func(r rune) bool { return r <= ' ' })
	loc = strings.NewReplacer("\t", "", "\r", "", "\n", "", `\`, "/").Replace(loc)
	ref, err := url.Parse(loc)
	if err != nil {
		return base // a browser refuses it: it stays where it is
	}
	return base.ResolveReference(ref)
}

func TestSafeNextRefusesBypasses(t *testing.T) {
	t.Parallel()
	for _, next := range nextBypasses {
		if got := safeNext(next); got != "/" {
			t.Errorf("safeNext(%q) = %q, want /", next, got)
		}
	}
	for _, next := range nextKept {
		if got := safeNext(next); got != next {
			t.Errorf("safeNext(%q) = %q, want it kept", next, got)
		}
	}
}

// The login's redirect, followed the way a browser follows it, lands on
// the console itself whatever next says; a page of the console is kept.
func TestLoginRedirectStaysOnSite(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	base, err := url.Parse(b.srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	for _, next := range append(append([]string{}, nextBypasses...), nextKept...) {
		// The transport, not a client: http.Client refuses a Location with
		// a control character before any check could see it; a browser
		// follows it.
		form := url.Values{"user": {"alice"}, "password": {testPassword}, "next": {next}}
		req, _ := http.NewRequest(http.MethodPost, base.String(), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode == http.StatusBadRequest && badText(next) != "" {
			continue // a NUL byte or invalid UTF-8: refused before the login (TestCarelessInputIsRefused), no redirect at all
		}
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("next %q: %d", next, resp.StatusCode)
		}
		if got := browserTarget(t, base, loc); got.Host != base.Host || got.Scheme != base.Scheme {
			t.Errorf("next %q: Location %q takes the browser to %s", next, loc, got)
		}
	}
	// The login page carries next into its form, through the same check.
	page := b.anon(t).get("/login?next=" + url.QueryEscape("/\t/evil.example"))
	if strings.Contains(page.body, "evil.example") {
		t.Errorf("login page keeps a foreign next: %s", page.body)
	}
}

// TestUnknownNameCostsWhatAKnownOneDoes: the hash an unknown name is
// checked against has the cost of the users' hashes (hash-password makes
// cost 12), so a login for an unknown name takes as long as a wrong
// password for a known one: names cannot be enumerated by timing. Costs,
// not clocks: bcrypt's time is set by its cost.
func TestUnknownNameCostsWhatAKnownOneDoes(t *testing.T) {
	t.Parallel()
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), 12)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newAuthenticator(Config{Users: map[string][]byte{"ann": h}}, pg.DB{})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := bcrypt.Cost(a.dummy); err != nil || c != 12 {
		t.Fatalf("dummy hash cost %d (%v), want the users' 12", c, err)
	}
	if a.check("nobody", "pw") || a.check("ann", "wrong") || !a.check("ann", "pw") {
		t.Fatal("check answers wrong")
	}
}
