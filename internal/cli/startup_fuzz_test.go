package cli_test

import (
	"context"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/internal/cli/auditorcli"
	"github.com/pelguard/pelguard/internal/cli/consolecli"
	"github.com/pelguard/pelguard/internal/cli/consumercli"
	"github.com/pelguard/pelguard/internal/cli/reapercli"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// The settings that carry a secret, as FuzzStartupSecrets numbers them.
const (
	fieldDatabase = iota
	fieldRedis
	fieldStripeKey
	fieldSlackWebhook
	fieldWebhookSecret
	fieldCount
)

// A start-up path: one command of one binary, and the flags that make
// every other setting valid and quick to fail (Postgres and Redis on a
// closed port, no wait, no listener that could clash).
type startPath struct {
	name string
	main func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	args []string
	// takes reports the fields this command reads.
	takes [fieldCount]bool
}

const (
	closedDB    = "postgres://pelguard@127.0.0.1:1/pelguard?sslmode=disable&connect_timeout=1"
	closedRedis = "redis://127.0.0.1:1/0?dial_timeout=1s&max_retries=-1"
	validKey    = "sk_test_pelguardFuzz"
)

func startPaths(usersFile string) []startPath {
	all := [fieldCount]bool{true, true, true, true, false}
	return []startPath{
		{"consumer run", consumercli.Main, []string{"run", "--metrics-addr", "", "--wait-for-deps", "0"}, all},
		{"consumer webhook", consumercli.Main, []string{"webhook", "--metrics-addr", "", "--listen", "127.0.0.1:0", "--wait-for-deps", "0"},
			[fieldCount]bool{fieldDatabase: true, fieldSlackWebhook: true, fieldWebhookSecret: true}},
		{"consumer migrate", consumercli.Main, []string{"migrate", "status", "--wait-for-deps", "0"}, [fieldCount]bool{fieldDatabase: true}},
		{"reaper run", reapercli.Main, []string{"run", "--metrics-addr", "", "--wait-for-deps", "0"}, all},
		{"auditor run", auditorcli.Main, []string{"run", "--wait-for-deps", "0"}, all},
		{"console serve", consolecli.Main, []string{"serve", "--users-file", usersFile, "--listen", "127.0.0.1:0", "--wait-for-deps", "0"}, all},
	}
}

// FuzzStartupSecrets feeds malformed settings to every binary's start-up
// path and searches everything it prints for the secret. A setting is
// prefix+secret+suffix; the secret is the password of a URL or DSN (it
// stands between the userinfo's ':' and the URL's last '@', or after
// password=), the Stripe key, the Slack webhook URL or the webhook signing
// secret. Whatever the fuzzer makes of the text around it, the secret must
// appear neither on stdout nor on stderr (where every start-up error
// goes), verbatim or percent-decoded. `go test` runs the seeds; `make fuzz`
// fuzzes.
func FuzzStartupSecrets(f *testing.F) {
	users := filepath.Join(f.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:$2a$04$abcdefghijklmnopqrstuu0123456789012345678901234567890\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	paths := startPaths(users)
	for _, s := range []struct {
		field                  int
		prefix, secret, suffix string
	}{
		// Issue 25's shapes: no scheme slashes, a scheme without its colon.
		{fieldDatabase, "postgresql:/billing:", "Secret0pw", "@db/x"},
		{fieldDatabase, "postgres:billing:", "Secret0pw", "@db/x"},
		{fieldRedis, "redis//:", "Secret0pw", "@host"},
		{fieldRedis, "redis:/:", "Secret0pw", "@host"}, // go-redis printed it twice
		{fieldRedis, "redis:", "Secret0pw", "@host:6379/0"},
		// Well-formed but wrong elsewhere: port, database, host, escape.
		{fieldDatabase, "postgres://billing:", "Secret0pw", "@db:xx/x"},
		{fieldDatabase, "postgres://billing:", "Secret0pw", "@[db/x"},
		{fieldDatabase, "postgres://billing:", "Sec ret0pw", "@db/x"},
		{fieldDatabase, "postgres://billing:", "Secret0pw", "@db/x?sslmode=bogus"},
		{fieldDatabase, "postgres://billing:", "Sec/ret0pw", "@db/x"},
		{fieldDatabase, "postgres://billing:", "Sec#ret0pw", "@db/x"},
		{fieldDatabase, "postgres://billing@db/x?password=", "Secret0pw", "&sslmode=bogus"},
		{fieldDatabase, "postgres:///:", "Secret0pw", "@"}, // pgx: database ":Secret0pw@", quoted by the server
		{fieldDatabase, "postgres:///billing:", "Secret0pw", "@db/x"},
		{fieldRedis, "redis://:", "Secret0pw", "@host:xx"},
		{fieldRedis, "redis://:", "Secret0pw", "@host/abc"},
		{fieldRedis, "redis://:", "Secret%zzpw", "@host/0"},
		{fieldRedis, "redis://:", "123#Secret0pw", "@host/0"},
		{fieldRedis, "redis+cluster://app:", "Secret0pw", "@h1:1/7"},
		{fieldRedis, "redis+cluster://app:", "Secret0pw", "@h1/"},
		{fieldRedis, "redis://u:", "Secret0pw", "@ho st/0"},
		// libpq keyword/value, quoted and not, broken after the password.
		{fieldDatabase, "host=db user=billing password=", "Secret0pw", " sslmode=bogus"},
		{fieldDatabase, "host=db password='", "Secret0pw", "' port=xx"},
		{fieldDatabase, "host=db password='", "Secret0pw", ""},
		{fieldDatabase, "host=db sslpassword=", "Secret0pw", " port=xx"},
		{fieldDatabase, "host=db password=", "Sec,ret;0pw", " port=xx"},
		// Keys and secrets of the wrong kind, or with stray white space.
		{fieldStripeKey, "pk_live_", "Secret0key", ""},
		{fieldStripeKey, "whsec_", "Secret0key", ""},
		{fieldStripeKey, " sk_live_", "Secret0key", ""},
		{fieldStripeKey, "sk_test_", "Secret0key", "\n"},
		{fieldStripeKey, "", "garbageSecret0key", ""},
		{fieldStripeKey, "sk_test_", "Secret0key", "-x"},
		{fieldSlackWebhook, "https://hooks.slack.com/services/T000/B000/", "Secret0hook", ""},
		{fieldSlackWebhook, "http://hooks.slack.com/services/T000/B000/", "Secret0hook", ""},
		{fieldSlackWebhook, "hooks.slack.com/services/T000/B000/", "Secret0hook", ""},
		{fieldSlackWebhook, "https://hooks.slack.com/services/T000/B000/", "Secret0hook", "%zz"},
		{fieldSlackWebhook, "https://user:", "Secret0hook", "@hooks.slack.com:xx/services"},
		{fieldWebhookSecret, "", "Secret0whsec", ""},
		{fieldWebhookSecret, "sk_test_", "Secret0whsec", ""},
		{fieldWebhookSecret, "whsec", "Secret0whsec", ""},
	} {
		for i := range paths {
			if paths[i].takes[s.field] {
				f.Add(uint8(i), uint8(s.field), s.prefix, s.secret, s.suffix)
			}
		}
	}
	// Every URL delimiter, unencoded, in every part of every URL form; each
	// seed runs on one start path, the paths taken in turn.
	for n, s := range delimiterSeeds() {
		var takers []int
		for i := range paths {
			if paths[i].takes[s.field] {
				takers = append(takers, i)
			}
		}
		f.Add(uint8(takers[n%len(takers)]), uint8(s.field), s.prefix, s.secret, s.suffix)
	}
	f.Fuzz(func(t *testing.T, pathN, fieldN uint8, prefix, secret, suffix string) {
		p, field := paths[int(pathN)%len(paths)], int(fieldN)%fieldCount
		secret = secretRunes(secret)
		value := prefix + secret + suffix
		if !p.takes[field] || len(secret) < 8 || len(value) > 400 || strings.ContainsRune(value, 0) {
			return // a secret shorter than 8 may well be a word of the messages
		}
		args := append([]string{}, p.args...)
		settings := map[int]string{fieldDatabase: closedDB, fieldRedis: closedRedis, fieldStripeKey: validKey}
		settings[field] = value
		for f, flag := range map[int]string{fieldDatabase: "--database-url", fieldRedis: "--redis-url",
			fieldStripeKey: "--stripe-key", fieldSlackWebhook: "--slack-webhook-url"} {
			if v, ok := settings[f]; ok && p.takes[f] {
				args = append(args, flag+"="+v)
			}
		}
		whsec := "whsec_pelguardFuzz0"
		if field == fieldWebhookSecret {
			whsec = value
		}
		t.Setenv("PELGUARD_STRIPE_WEBHOOK_SECRET", whsec)

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var stdout, stderr testenv.SyncBuffer // go-redis dials (and logs) on goroutines of its own
		code := p.main(ctx, args, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if !secretPlaced(field, prefix, value, suffix) {
			return
		}
		for _, form := range secretForms(secret) {
			if strings.Contains(out, form) {
				t.Fatalf("%s with %s %q (exit %d) printed the secret %q:\n%s", p.name, fieldName(field), value, code, form, out)
			}
		}
	})
}

// secretRunes keeps what a password, key or token may hold and the fuzz
// contract can place: no white space, quote, backslash or '&' (each ends a
// keyword/value or query value, so that a secret holding one is not one
// secret), and printable ASCII only.
func secretRunes(s string) string {
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' || strings.ContainsRune(`"'\&`, r) {
			return -1
		}
		return r
	}, s)
}

var (
	// keywordValue is a libpq keyword/value string: no '@' rule there.
	keywordValue = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)
	// schemePrefix is how a connection URL starts, slashes or not.
	schemePrefix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*:/*`)
	// afterPasswordKey: the secret is the value of a password-like key.
	afterPasswordKey = regexp.MustCompile(`(?i)password\s*=\s*['"]?$`)
)

// secretPlaced reports whether the fuzzer left the secret where a secret
// is: anywhere in a key, token or webhook URL; in a connection URL, before
// its last '@' (the userinfo, however malformed) or after password=.
func secretPlaced(field int, prefix, value, suffix string) bool {
	if field != fieldDatabase && field != fieldRedis {
		return true
	}
	if afterPasswordKey.MatchString(prefix) {
		return true
	}
	// The password of a URL's userinfo: after a ':' that follows the
	// scheme, before the last '@'. A userinfo without ':' is a user name.
	userinfo := prefix[len(schemePrefix.FindString(prefix)):]
	return !keywordValue.MatchString(value) && strings.Contains(suffix, "@") && strings.Contains(userinfo, ":")
}

// secretForms are the ways output may show the secret s: verbatim,
// percent-decoded, and each piece of it between URL delimiters that is
// long enough not to be a word of the messages (a parser that splits a
// password at its '@' quotes the rest as a host).
func secretForms(s string) []string {
	forms := []string{s}
	if d, err := url.PathUnescape(s); err == nil && d != s && len(d) >= 8 {
		forms = append(forms, d)
	}
	for _, piece := range strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune("@:/?#", r) }) {
		if piece != s && len(piece) >= 8 {
			forms = append(forms, piece)
		}
	}
	return forms
}

type secretSeed struct {
	field                  int
	prefix, secret, suffix string
}

// delimiterSeeds puts each of '@', ':', '/', '?' and '#', unencoded, in
// each part (user, password, host, port, database, query, fragment) of a
// Postgres URL and of each Redis URL form (one node, Cluster, Sentinel). The secret is always the
// password, in two pieces long enough to be searched for on their own.
func delimiterSeeds() []secretSeed {
	type form struct {
		field                             int
		scheme, user, host, port, db, qry string
	}
	forms := []form{
		{fieldDatabase, "postgres://", "billing", "127.0.0.1", "1", "pelguard", "sslmode=disable&connect_timeout=1"},
		{fieldRedis, "redis://", "app", "127.0.0.1", "1", "0", "dial_timeout=1s&max_retries=-1"},
		{fieldRedis, "redis+cluster://", "app", "127.0.0.1", "1", "", "dial_timeout=1s&max_retries=-1"},
		{fieldRedis, "redis+sentinel://", "app", "127.0.0.1", "1", "0", "master_name=billing&dial_timeout=1s&max_retries=-1"},
	}
	var out []secretSeed
	for _, f := range forms {
		for _, c := range []string{"@", ":", "/", "?", "#"} {
			for part := range 7 {
				user, pw, host, port, db, qry, frag := f.user, "Secret0pwPassw0rd1", f.host, f.port, f.db, f.qry, ""
				switch part {
				case 0:
					user = user[:2] + c + user[2:]
				case 1:
					pw = "Secret0pw" + c + "Passw0rd1"
				case 2:
					host = "127.0" + c + "0.1"
				case 3:
					port = "1" + c + "2"
				case 4:
					db = db + c + "x"
				case 5:
					qry = qry + c + "x"
				case 6:
					frag = "#frag" + c + "x"
				}
				out = append(out, secretSeed{f.field, f.scheme + user + ":", pw,
					"@" + host + ":" + port + "/" + db + "?" + qry + frag})
			}
		}
	}
	return out
}

func fieldName(f int) string {
	return [...]string{"DATABASE_URL", "REDIS_URL", "STRIPE_API_KEY", "SLACK_WEBHOOK_URL", "PELGUARD_STRIPE_WEBHOOK_SECRET"}[f]
}

// Every binary that takes a Stripe key refuses one of the wrong kind at
// start (exit 2, before waiting for anything), naming the kind found and
// the kinds wanted, never the key: such a key would start the consumer and
// dead-letter every event on Stripe's 401.
func TestStartupRefusesWrongKeyKinds(t *testing.T) {
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:$2a$04$abcdefghijklmnopqrstuu0123456789012345678901234567890\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, key := range []struct{ value, kind string }{
		{"pk_live_TYooMQauvdEDq54NiTphI7jx", "publishable key (pk_live_…)"},
		{"whsec_abcdefgh12345678SECRET", "webhook signing secret"},
		{"garbageKEYgarbage0123", "does not start like a Stripe API key"},
		{" sk_test_4eC39HqLyjWDarjtT1zdp7dc", "white space before or after"},
	} {
		for _, p := range startPaths(users) {
			if !p.takes[fieldStripeKey] {
				continue
			}
			args := append(append([]string{}, p.args...), "--database-url="+closedDB, "--redis-url="+closedRedis, "--stripe-key="+key.value)
			var stdout, stderr testenv.SyncBuffer // go-redis dials (and logs) on goroutines of its own
			code := p.main(context.Background(), args, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != 2 || !strings.Contains(out, key.kind) || !strings.Contains(out, "sk_live_…, sk_test_…, rk_live_… or rk_test_…") {
				t.Errorf("%s with key %q: exit %d, want 2 naming %q and the kinds wanted:\n%s", p.name, key.value, code, key.kind, out)
			}
			if body := strings.TrimSpace(key.value)[8:]; strings.Contains(out, body) {
				t.Errorf("%s printed the key %q:\n%s", p.name, key.value, out)
			}
		}
	}
}

// A password with an unencoded '@' (or a user with one) is refused at
// start by every binary, exit 2 with the misplaced-character message,
// for Postgres and Redis alike: pgx splits the userinfo at the first '@'
// and took "P4ss@127.0.0.1" for the host, printing it on every retry.
// No piece of the password is printed.
func TestStartupRefusesAnAtInTheUserinfo(t *testing.T) {
	t.Setenv("PELGUARD_STRIPE_WEBHOOK_SECRET", "whsec_pelguardFuzz0")
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("alice:$2a$04$abcdefghijklmnopqrstuu0123456789012345678901234567890\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field int
		url   string
	}{
		{fieldDatabase, "postgres://postgres:s3cretXY@P4ssWord@127.0.0.1:5432/postgres"},
		{fieldDatabase, "postgres://post@gres:s3cretXY@127.0.0.1:5432/postgres"},
		{fieldRedis, "redis://:s3cretXY@P4ssWord@127.0.0.1:6379/0"},
		{fieldRedis, "redis://app:s3cretXY@P4ssWord@127.0.0.1:6379/0"},
		{fieldRedis, "redis+cluster://app:s3cretXY@P4ssWord@127.0.0.1:7000,127.0.0.1:7001/"},
		{fieldRedis, "redis+sentinel://:s3cretXY@P4ssWord@127.0.0.1:26379,127.0.0.1:26380/0?master_name=billing"},
	} {
		for _, p := range startPaths(users) {
			if !p.takes[c.field] {
				continue
			}
			settings := map[int]string{fieldDatabase: closedDB, fieldRedis: closedRedis}
			settings[c.field] = c.url
			args := append(append([]string{}, p.args...), "--database-url="+settings[fieldDatabase])
			if p.takes[fieldRedis] {
				args = append(args, "--redis-url="+settings[fieldRedis])
			}
			if p.takes[fieldStripeKey] {
				args = append(args, "--stripe-key="+validKey)
			}
			var stdout, stderr testenv.SyncBuffer // go-redis dials (and logs) on goroutines of its own
			code := p.main(context.Background(), args, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != 2 || !strings.Contains(out, "the text before '@' is not a URL's user and password") {
				t.Errorf("%s with %s %s: exit %d, want 2 and the misplaced-character message:\n%s", p.name, fieldName(c.field), c.url, code, out)
			}
			for _, piece := range []string{"s3cretXY", "P4ssWord"} {
				if strings.Contains(out, piece) {
					t.Errorf("%s with %s %s printed %q:\n%s", p.name, fieldName(c.field), c.url, piece, out)
				}
			}
		}
	}
}
