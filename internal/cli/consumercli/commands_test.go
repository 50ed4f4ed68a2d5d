package consumercli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// call runs Main and returns the exit code, stdout and stderr.
func call(ctx context.Context, args ...string) (int, string, string) {
	// Safe for concurrent writes: go-redis's logger is process-wide
	// (cli.RouteLibraryLogs), so a background dial of another parallel
	// test's command may write here too.
	var out, errb testenv.SyncBuffer
	code := Main(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBadFlagsExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"--log-format", "xml"},
		{"cap", "set", "--period", "2026-11"},
		{"meter-cap", "set", "--meter", "api", "--customer", "cus_1", "--month", "2026-11"},
		{"meter-cap", "set", "--meter", "api", "--customer", "cus_1", "--month", "Nov", "--cap", "5"},
		{"meter-cap", "set", "--meter", "api", "--customer", "cus_1", "--month", "*", "--cap", "5", "--counts", "dollars"},
		{"meter-cap", "remove", "--meter", "api"},
		{"meter-cap", "show", "--in", "*"},
		{"meter-cap", "raise"},
		{"meter-settle", "--identifier", "pg_x", "--event-ts", "2026-11-30T12:00:00Z", "--reason", "checked"},
		{"meter-settle", "--identifier", "pg_x", "--event-ts", "2026-11-30T12:00:00Z", "--counted", "--not-counted", "--reason", "checked"},
		{"meter-settle", "--identifier", "pg_x", "--event-ts", "yesterday", "--counted", "--reason", "checked"},
		{"meter-settle", "--identifier", "pg_x", "--event-ts", "2026-11-30T12:00:00Z", "--counted"},
		{"migrate", "sideways"},
		{"unexpected-arg"},
		{"--stream", "a,a"},
		{"--stream", "a=", "--stream", "b"},
	} {
		var out, errb testenv.SyncBuffer
		if code := Main(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
		if errb.Len() == 0 {
			t.Errorf("%v: no message", args)
		}
	}
	var out, errb testenv.SyncBuffer
	if code := Main(context.Background(), []string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "--require-cap") {
		t.Errorf("--help: exit %d: %s", code, errb.String())
	}
}

func TestCapCommands(t *testing.T) {
	t.Parallel()
	_, url := testenv.DBWithURL(t)
	var out, errb testenv.SyncBuffer
	if code := Main(context.Background(), []string{"cap", "set", "--database-url", url, "--db-schema", testenv.SchemaOfURL(url), "--period", "2026-11", "--cents", "1375000"}, &out, &errb); code != 0 {
		t.Fatalf("cap set: %d %s", code, errb.String())
	}
	out.Reset()
	if code := Main(context.Background(), []string{"cap", "show", "--database-url", url, "--db-schema", testenv.SchemaOfURL(url)}, &out, &errb); code != 0 {
		t.Fatalf("cap show: %d %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "2026-11") || !strings.Contains(out.String(), "13750.00 USD") {
		t.Fatalf("cap show output:\n%s", out.String())
	}
	out.Reset()
	if code := Main(context.Background(), []string{"migrate", "status", "--database-url", url, "--db-schema", testenv.SchemaOfURL(url)}, &out, &errb); code != 0 ||
		strings.Contains(out.String(), "pending") || !strings.Contains(out.String(), "applied") {
		t.Fatalf("migrate status: %d\n%s%s", code, out.String(), errb.String())
	}
}

// meter-cap set, show (with each cap's use this month) and remove.
func TestMeterCapCommands(t *testing.T) {
	t.Parallel()
	pool, url := testenv.DBWithURL(t)
	ctx := context.Background()
	db := []string{"--database-url", url, "--db-schema", testenv.SchemaOfURL(url)}
	cmd := func(args ...string) string {
		t.Helper()
		var out, errb testenv.SyncBuffer
		if code := Main(ctx, append(args, db...), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	month := time.Now().UTC().Format("2006-01")
	// This month: cus_1 used 7 of its own cap, cus_2 and cus_3 fall under
	// every customer's cap of 10, which cus_3 reached.
	for _, u := range []struct {
		cus   string
		units int64
	}{{"cus_1", 7}, {"cus_2", 4}, {"cus_3", 10}} {
		if _, err := pool.Exec(ctx, `INSERT INTO meter_usage (event_name, stripe_customer_id, month, units, events, updated_at)
			VALUES ('api', $1, date_trunc('month', now() AT TIME ZONE 'UTC')::date, $2, 1, now())`, u.cus, u.units); err != nil {
			t.Fatal(err)
		}
	}
	out := cmd("meter-cap", "set", "--meter", "api", "--customer", "cus_1", "--month", "*", "--cap", "100")
	if !strings.Contains(out, "100 units") || !strings.Contains(out, "7 used") {
		t.Fatalf("set:\n%s", out)
	}
	cmd("meter-cap", "set", "--meter", "api", "--customer", "*", "--month", month, "--cap", "10")
	cmd("meter-cap", "set", "--meter", "logins", "--customer", "*", "--month", "*", "--cap", "3", "--counts", "events")
	out = cmd("meter-cap", "show")
	for _, want := range []string{"cus_1", "7 used", "2 customers, 1 at the cap", "3 events"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if out = cmd("meter-cap", "show", "--meter", "logins"); strings.Contains(out, "cus_1") {
		t.Errorf("show --meter logins lists another meter:\n%s", out)
	}
	if out = cmd("meter-cap", "remove", "--meter", "api", "--customer", "cus_1", "--month", "*"); !strings.Contains(out, "removed") {
		t.Fatalf("remove: %s", out)
	}
	var out2, errb testenv.SyncBuffer
	if code := Main(ctx, append([]string{"meter-cap", "remove", "--meter", "api", "--customer", "cus_1", "--month", "*"}, db...), &out2, &errb); code != 2 ||
		!strings.Contains(errb.String(), "meter-cap show --meter api") {
		t.Fatalf("removing it twice: exit %d: %s", code, errb.String())
	}
}

func TestReplayCommand(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream, other := testenv.Name(t, "billing"), testenv.Name(t, "other")
	testenv.CleanupKeys(t, rdb, stream, stream+":dead", other, other+":dead")
	ctx := context.Background()
	for _, d := range []struct{ stream, reason string }{
		{stream, "spend_cap"}, {stream, "not_json"}, {stream, "spend_cap"}, {other, "spend_cap"},
	} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: d.stream + ":dead", Values: map[string]any{"payload": "{}", "reason": d.reason, "source_id": "1-0"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb testenv.SyncBuffer
	// Two streams in one value, as PELGUARD_STREAM lists a consumer's shards.
	args := []string{"replay", "--redis-url", testenv.RedisURL(), "--stream", stream + "," + other, "--reason", "spend_cap"}
	if code := Main(ctx, append(args, "--dry-run"), &out, &errb); code != 0 || !strings.Contains(out.String(), "would replay 2 dead letter(s) onto "+stream) ||
		!strings.Contains(out.String(), "would replay 1 dead letter(s) onto "+other) {
		t.Fatalf("dry run: %d %s %s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := Main(ctx, args, &out, &errb); code != 0 || !strings.Contains(out.String(), "replayed 2") {
		t.Fatalf("replay: %d %s %s", code, out.String(), errb.String())
	}
	for s, want := range map[string][2]int64{stream: {2, 1}, other: {1, 0}} {
		if n, _ := rdb.XLen(ctx, s).Result(); n != want[0] {
			t.Errorf("%s: %d entries replayed onto the stream, want %d", s, n, want[0])
		}
		if n, _ := rdb.XLen(ctx, s+":dead").Result(); n != want[1] {
			t.Errorf("%s: %d dead letters left, want %d", s, n, want[1])
		}
	}
}

// `consumer migrate --help` and `-h` print the migrate usage and exit 0
// (they used to fail with "unknown migrate command" and point at the very
// command that had failed); so do `cap --help` and `migrate up --help`.
// unknownCommand is the refusal of a command or verb (help texts may say
// "unknown" of other things: an event's outcome).
var unknownCommand = regexp.MustCompile(`unknown (\w+ )?command`)

func TestSubcommandHelpExits0(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--help"}, "migrate up|down|status"},
		{[]string{"migrate", "-h"}, "migrate up|down|status"},
		{[]string{"migrate", "up", "--help"}, "--yes"},
		{[]string{"cap", "--help"}, "cap set --period P --cents N"},
		{[]string{"cap", "-h"}, "--cents"},
		{[]string{"cap", "show", "--help"}, "--period"},
		{[]string{"replay", "--help"}, "--reason"},
	} {
		code, out, errb := call(context.Background(), tc.args...)
		if code != 0 || !strings.Contains(errb, tc.want) || unknownCommand.MatchString(errb) {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s", tc.args, code, out, errb)
		}
	}
	// Without a verb it is still a mistake, and the hint it gives works.
	code, _, errb := call(context.Background(), "migrate")
	if code != 2 || !strings.Contains(errb, "up, down, status or move") || !strings.Contains(errb, "Run 'pelguard-consumer migrate --help'") {
		t.Errorf("migrate without a verb: exit %d\n%s", code, errb)
	}
	code, _, errb = call(context.Background(), "migrate", "sideways")
	if code != 2 || !strings.Contains(errb, `unknown migrate command "sideways"`) {
		t.Errorf("migrate sideways: exit %d\n%s", code, errb)
	}
}

// `consumer help` prints the usage (the commands and run's flags) on stdout
// and exits 0; `help COMMAND` prints that command's; `help nosuch` exits 2.
// `consumer --help` lists the commands as well.
func TestHelpCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	code, out, errb := call(ctx, "help")
	if code != 0 || !strings.Contains(out, "--require-cap") || !strings.Contains(out, "Commands:") || errb != "" {
		t.Errorf("help: exit %d, stdout:\n%s\nstderr:\n%s", code, out, errb)
	}
	for _, cmd := range []string{"run", "cap", "replay", "migrate"} {
		if !strings.Contains(out, "\n  "+cmd+" ") {
			t.Errorf("help does not list %s:\n%s", cmd, out)
		}
	}
	code, out, _ = call(ctx, "help", "cap")
	if code != 0 || !strings.Contains(out, "--cents") {
		t.Errorf("help cap: exit %d\n%s", code, out)
	}
	code, out, _ = call(ctx, "help", "migrate")
	if code != 0 || !strings.Contains(out, "--yes") {
		t.Errorf("help migrate: exit %d\n%s", code, out)
	}
	if code, _, errb := call(ctx, "help", "nosuch"); code != 2 || !strings.Contains(errb, `unknown command "nosuch"`) {
		t.Errorf("help nosuch: exit %d\n%s", code, errb)
	}
	code, _, errb = call(ctx, "--help")
	if code != 0 || !strings.Contains(errb, "Commands:") || !strings.Contains(errb, "replay") {
		t.Errorf("--help does not list the commands: exit %d\n%s", code, errb)
	}
}

// `version` and `--version` print the build's version and exit 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version", "-version"} {
		code, out, _ := call(context.Background(), arg)
		if code != 0 || !strings.HasPrefix(out, "pelguard-consumer ") || !strings.Contains(out, "revision") {
			t.Errorf("%s: exit %d, %q", arg, code, out)
		}
	}
}

// --safe-key-window's default shows (its name contains "key", which used
// to redact it), while --stripe-key's default, taken from STRIPE_API_KEY,
// never does, even when it matches none of redact's patterns. Not parallel:
// it sets the environment.
func TestHelpDefaults(t *testing.T) {
	const opaque = "opaque-secret-value-no-pattern"
	t.Setenv("STRIPE_API_KEY", opaque)
	t.Setenv("DATABASE_URL", "postgres://billing:hunter2pw@db.internal:5432/billing")
	code, _, errb := call(context.Background(), "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"(default 23h0m0s)",              // --safe-key-window
		"(default [REDACTED])",           // --stripe-key
		"billing:[REDACTED]@db.internal", // the URL stays readable without its password
	} {
		if !strings.Contains(errb, want) {
			t.Errorf("--help lacks %q:\n%s", want, errb)
		}
	}
	for _, secret := range []string{opaque, "hunter2pw"} {
		if strings.Contains(errb, secret) {
			t.Errorf("--help printed %q", secret)
		}
	}
}
