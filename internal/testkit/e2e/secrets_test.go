package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// Every binary, under every scenario, with secrets planted in its
// environment and flags: --help, bad flags, an unrestricted live key,
// unreachable Postgres, Redis refusing the password, a normal run. The
// output is scanned for the secrets by runBin and proc.stop.
func TestNoSecretInOutput(t *testing.T) {
	t.Parallel()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	_, dbURL := testenv.DBWithURL(t)
	dbURL = withPassword(t, dbURL)
	rdb := testenv.Redis(t)
	stream := testenv.Name(t, "billing")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead")

	secretEnv := func(extra ...string) []string {
		return baseEnv(append([]string{
			"DATABASE_URL=" + dbURL, "REDIS_URL=" + testenv.RedisURL(),
			"STRIPE_API_KEY=" + testKey, "STRIPE_API_BASE=" + sim.URL(),
			"SLACK_WEBHOOK_URL=" + slackWebhook, "PELGUARD_STREAM=" + stream,
		}, extra...)...)
	}
	const waitBriefly = "PELGUARD_WAIT_FOR_DEPS=2s"
	type scenario struct {
		name string
		env  []string
		args []string
		code int    // wanted exit code; -1: any
		want string // substring of the output
	}
	// The auditor with no command prints its usage: the common scenarios
	// name its default command.
	withCommand := func(ss []scenario, cmd string) []scenario {
		for i := range ss {
			if ss[i].args == nil {
				ss[i].args = []string{cmd}
			}
		}
		return ss
	}
	common := func(bin string) []scenario {
		return []scenario{
			{"help", secretEnv(), []string{"--help"}, 0, "Stripe permissions"},
			{"help with secrets in flags", secretEnv(), []string{"--stripe-key", testKey, "--slack-bot-token", slackBotToken, "--database-url", dbURL, "--help"}, 0, "--stripe-key"},
			{"bad flag", secretEnv(), []string{"--slack-bot-token", slackBotToken, "--stripe-key", restrictedKey, "--no-such-flag"}, 2, "no-such-flag"},
			{"bad value", secretEnv(), []string{"--stripe-key", testKey, "--log-level", "loud"}, 2, "--log-level"},
			{"live key refused", secretEnv("STRIPE_API_KEY=" + liveKey), nil, 2, "refusing an unrestricted live key"},
			// Unreachable: ExitUnavailable after the wait, whose log lines
			// (one per try) carry no password either.
			{"unreachable postgres", secretEnv("DATABASE_URL="+unreachableDB, waitBriefly), nil, 3, bin},
			{"slack token without channel", secretEnv("SLACK_WEBHOOK_URL=", "SLACK_BOT_TOKEN="+slackBotToken), nil, 2, "SLACK_CHANNEL"},
			{"migrate, unreachable postgres", secretEnv("DATABASE_URL="+unreachableDB, waitBriefly), []string{"migrate", "status"}, 3, "migrate"},
			{"migrate status", secretEnv(), []string{"migrate", "status"}, 0, "applied"},
		}
	}
	cases := map[string][]scenario{
		"consumer": append(common("consumer"),
			scenario{"unreachable redis", secretEnv("REDIS_URL="+unreachableRDS, waitBriefly), []string{"--metrics-addr", ""}, 3, "Redis"},
			scenario{"cap show", secretEnv(), []string{"cap", "show"}, 0, "PERIOD"},
		),
		"reaper": append(common("reaper"),
			scenario{"redis url with a password", secretEnv("REDIS_URL=" + passwordRedis()), []string{"--once", "--metrics-addr", ""}, 0, "reaper pass"},
			// Off the default metrics port, which "unreachable postgres" holds
			// while it waits.
			scenario{"unreachable redis", secretEnv("REDIS_URL="+unreachableRDS, waitBriefly), []string{"--once", "--metrics-addr", ""}, 3, "Redis"},
			scenario{"once", secretEnv(), []string{"--once", "--metrics-addr", ""}, 0, "reaper starting"},
			scenario{"dry run", secretEnv(), []string{"--once", "--dry-run", "--metrics-addr", ""}, 0, "dry run"},
		),
		"auditor": append(withCommand(common("auditor"), "run"),
			scenario{"run", secretEnv(), []string{"run", "--from", "2026-01-01", "--to", "2026-01-02"}, 0, "charges"},
			scenario{"run json", secretEnv(), []string{"run", "--json", "--from", "2026-01-01", "--to", "2026-01-02"}, 0, "charges_scanned"},
			scenario{"findings", secretEnv(), []string{"findings"}, 0, ""},
			scenario{"refund bad args", secretEnv(), []string{"refund"}, 2, "finding ID"},
			scenario{"bad schedule", secretEnv(), []string{"--schedule", "every day"}, 2, "schedule"},
		),
	}
	for bin, scs := range cases {
		for _, sc := range scs {
			t.Run(bin+"/"+sc.name, func(t *testing.T) {
				t.Parallel()
				args := sc.args
				res := runBin(t, bin, sc.env, 60*time.Second, args...)
				if sc.code >= 0 && res.code != sc.code {
					t.Errorf("exit %d, want %d\n%s", res.code, sc.code, res.out)
				}
				if !strings.Contains(res.out, sc.want) {
					t.Errorf("output lacks %q:\n%s", sc.want, res.out)
				}
			})
		}
	}

	// A normal consumer run with Slack configured: a good event is charged,
	// a bad one is dead-lettered and its alert goes to the (unreachable)
	// webhook, whose error is logged.
	t.Run("consumer/normal run", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		good := event.Event{CustomerID: "c_ok", StripeCustomerID: "cus_ok", AmountCents: 2500, BillingPeriod: "2026-11", Currency: "usd"}
		for _, p := range []string{good.Payload(), `{"customer_id":"c_bad","password":"` + dbPassword + `"}`} {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": p}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		p := startBin(t, "consumer", secretEnv("REDIS_URL="+passwordRedis()), "--metrics-addr", "127.0.0.1:0", "--block", "100ms",
			"--log-level", "debug", "--dead-letter-alert-interval", "200ms")
		testenv.Eventually(t, 30*time.Second, func() bool {
			n, _ := rdb.XLen(ctx, stream+":dead").Result()
			return sim.SucceededCharges("c_ok", "2026-11") == 1 && n == 1
		}, "charged and dead-lettered")
		testenv.Eventually(t, 30*time.Second, func() bool {
			return strings.Contains(p.out.String(), "slack post failed")
		}, "the Slack delivery failure is logged (redacted)")
		p.stop()
	})
}

// passwordRedis is REDIS_URL with a password. A Redis without requirepass
// answers AUTH with "called without any password configured", which
// go-redis tolerates: the binary runs with the password in every connection
// string it handles, and must never print it.
func passwordRedis() string {
	u := testenv.RedisURL()
	i := strings.Index(u, "://")
	rest := u[i+3:]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	return u[:i+3] + ":" + redisPassword + "@" + rest
}
