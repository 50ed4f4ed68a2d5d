package redact

import (
	"errors"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	t.Parallel()
	secrets := []string{
		"sk_live_51HxYzAbCdEf0123456789",
		"sk_test_4eC39HqLyjWDarjtT1zdp7dc",
		"rk_live_abcdef0123456789",
		"whsec_abcdefgh12345678",
		"xoxb-1234567890-abcdefghijk",
		"xapp-1-A0123456789-abcdef",
		"https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXX",
		"s3cretpw",
	}
	in := "key=" + secrets[0] + " test " + secrets[1] + " rk " + secrets[2] + " " + secrets[3] +
		" slack " + secrets[4] + " " + secrets[5] + " hook " + secrets[6] +
		" db postgres://billing:" + secrets[7] + "@db.internal:5432/ledger?sslmode=require" +
		" Authorization: Bearer abcdefghijklmnop"
	out := String(in)
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("secret %q survived redaction: %s", s, out)
		}
	}
	if strings.Contains(out, "abcdefghijklmnop") {
		t.Errorf("bearer token survived: %s", out)
	}
	if !strings.Contains(out, "billing:"+Mask+"@db.internal") {
		t.Errorf("user and host should stay readable: %s", out)
	}
}

func TestStringLeavesOrdinaryTextAlone(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"charged c_42 for 2026-11: ch_3Nabc", "cus_ABC", "redis://127.0.0.1:6379/0", "idempotency key 9f86d081884c7d65"} {
		if got := String(s); got != s {
			t.Errorf("String(%q) = %q, want unchanged", s, got)
		}
	}
}

func TestURL(t *testing.T) {
	t.Parallel()
	got := URL("postgres://u:p4ss@h:5432/db?sslmode=disable&password=other")
	if strings.Contains(got, "p4ss") || strings.Contains(got, "other") {
		t.Fatalf("URL leaked a password: %s", got)
	}
	if got := URL("redis://:hunter22@localhost:6379/0"); strings.Contains(got, "hunter22") {
		t.Fatalf("URL leaked a redis password: %s", got)
	}
}

func TestErrorKeepsChain(t *testing.T) {
	t.Parallel()
	base := errors.New("dial postgres://a:secretpw@h/db: refused")
	err := Error(base)
	if strings.Contains(err.Error(), "secretpw") {
		t.Fatalf("error leaked: %v", err)
	}
	if !errors.Is(err, base) {
		t.Fatal("errors.Is lost the original error")
	}
}

// The patterns that came from alerts.Redact: one function for logs, errors,
// alerts and --help.
func TestStringCoversWhatAlertsNeed(t *testing.T) {
	t.Parallel()
	for in, gone := range map[string]string{
		"xoxp-1-2-3":                            "xoxp-1-2-3",
		"sk_live_abc":                           "sk_live_abc",
		"pi_3Mtw_secret_YrKJUKribcBjcG8H":       "YrKJUKribcBjcG8H",
		"card 4242 4242 4242 4242 declined":     "4242 4242 4242 4242",
		"api_key=abc123secret":                  "abc123secret",
		"rediss://default:hunter2@cache:6380":   "hunter2",
		"http://hooks.slack.com/services/T/B/Z": "T/B/Z",
	} {
		if got := String(in); strings.Contains(got, gone) {
			t.Errorf("String(%q) = %q: %q survived", in, got, gone)
		}
	}
	for _, keep := range []string{"entry 1700000000000-0 idle 90000ms", "order 1234567890123", "stream id 4242424242424242-0"} {
		if got := String(keep); got != keep {
			t.Errorf("String(%q) = %q, want unchanged", keep, got)
		}
	}
	if got := URL("redis://:hunter22@localhost:6379/0"); got != "redis://:"+Mask+"@localhost:6379/0" {
		t.Errorf("URL = %q", got)
	}
}

// A connection setting that does not parse is printed with everything
// before its last '@' masked, whatever its slashes; issue 25's shapes
// printed the password (once or twice) before.
func TestURLMalformed(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"postgresql:/billing:Secret0pw@db/x":   "postgresql:/" + Mask + "@db/x",
		"postgres:billing:Secret0pw@db/x":      "postgres:" + Mask + "@db/x",
		"redis//:Secret0pw@host":               Mask + "@host",
		"redis:/:Secret0pw@host":               "redis:/" + Mask + "@host",
		"redis://:123#Secret0pw@host/0":        "redis://" + Mask + "@host/0",
		"postgres://billing:Sec ret0pw@db/x":   "postgres://" + Mask + "@db/x",
		"postgres://billing:Secret0pw@db:xx/x": "postgres://" + Mask + "@db:xx/x",
		"host=db password='Secret0pw":          "host=db password=" + Mask,
		"host=db sslpassword=Secret0pw port=1": "host=db sslpassword=" + Mask + " port=1",
		"host=db password=Sec,ret;0pw port=1":  "host=db password=" + Mask + " port=1",
		"host=db password='Sec\\'ret0pw' x=1":  "host=db password=" + Mask + " x=1",
	} {
		if got := URL(raw); got != want {
			t.Errorf("URL(%q) = %q, want %q", raw, got, want)
		}
	}
	if got := URL("postgres://billing:Secret0pw@db:5432/x?sslmode=disable"); got != "postgres://billing:"+Mask+"@db:5432/x?sslmode=disable" {
		t.Errorf("a well-formed URL keeps its user and host: %q", got)
	}
}

// Scrub masks what a library's error quotes of the setting: the raw text,
// Go-quoted or decoded, and pieces of the password a wrong split quotes.
func TestScrub(t *testing.T) {
	t.Parallel()
	for raw, msg := range map[string]string{
		"redis:/:Secret0pw@host":            `redis: invalid database number: ":Secret0pw@host"`,
		"redis//:Secret0pw@host":            `parse "redis//:Secret0pw@host": first path segment in URL cannot contain colon`,
		"redis://:Sec\tret0pw@host":         `parse "redis://:Sec\tret0pw@host": net/url: invalid control character in URL`,
		"postgres://u:Sec%41ret0pw@db:xx/x": `cannot parse: password SecAret0pw, port xx`,
		"redis://:Secret0pw/abc@host":       `invalid port ":Secret0pw" after host`,
		"host=db password='Secret0pw":       "cannot parse `host=db password='Secret0pw`: unterminated quoted string",
	} {
		got := Scrub(msg, raw)
		for _, secret := range []string{"Secret0pw", "SecAret0pw", `Sec\tret0pw`, "Secret0"} {
			if strings.Contains(got, secret) {
				t.Errorf("Scrub(%q, %q) = %q: %q survived", msg, raw, got, secret)
			}
		}
	}
	err := ScrubError(errors.New(`redis: invalid database number: ":Secret0pw@host"`), "redis:/:Secret0pw@host")
	if strings.Contains(err.Error(), "Secret0pw") || errors.Unwrap(err) == nil {
		t.Errorf("ScrubError = %v, want masked with the chain kept", err)
	}
}

func TestStringEnvironmentAndUnclosedSecrets(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"DB_PASSWORD=Secret0pw", "sslpassword=Secret0pw", `password="Secret0pw`, "password=Sec,ret0pw"} {
		if got := String(in); strings.Contains(got, "Secret0pw") || strings.Contains(got, "ret0pw") {
			t.Errorf("String(%q) = %q", in, got)
		}
	}
}

func TestMisplaced(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		"postgres:///:Secret0pw@db":               true, // pgx: database ":Secret0pw@db"
		"redis://:123#Secret0pw@host/0":           true,
		"postgresql:/billing:Secret0pw@db/x":      true,
		"postgres://u:Secret0pw@db/x?a=b@c":       true,
		"postgres://u:Sec@ret0pw@db:5432/x":       true, // pgx: host "ret0pw@db"
		"postgres://u%40x:Sec%40ret0pw@db:5432/x": false,
		"postgres://us@er:Secret0pw@db:5432/x":    true,
		"redis://:s3cret@P4ss@127.0.0.1:6379/0":   true, // go-redis would split at the last '@'; pgx would not
		"redis+cluster://app:p@w@h1:1,h2:2/":      true,
		"postgres://u:Secret0pw@/x?host=/run/pg":  false,
		"redis+cluster://app:pw@h1:1,h2:2/":       false,
		"host=db user=a@b password=Secret0pw":     false,
		"redis://127.0.0.1:6379/0":                false,
	} {
		if got := Misplaced(raw); got != want {
			t.Errorf("Misplaced(%q) = %v, want %v", raw, got, want)
		}
	}
}
