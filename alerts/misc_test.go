package alerts

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		gone    string // must not survive
		keeping string // must survive, when set
	}{
		{"key sk_live_51HqLyjWDarjtT1zdp7dc end", "sk_live_51HqLyjWDarjtT1zdp7dc", "end"},
		{"sk_test_abc123", "sk_test_abc123", ""},
		{"rk_live_51HqLyjWDarjtT1zdp7dc", "rk_live_51HqLyjWDarjtT1zdp7dc", ""},
		{"pk_test_TYooMQauvdEDq54NiTphI7jx", "pk_test_TYooMQauvdEDq54NiTphI7jx", ""},
		{"whsec_abcdefgh12345678", "whsec_abcdefgh12345678", ""},
		{"pi_3MtwBwLkdIwHu7ix28a3tqPa_secret_YrKJUKribcBjcG8HVhfZluoGH", "YrKJUKribcBjcG8HVhfZluoGH", "pi_3MtwBwLkdIwHu7ix28a3tqPa"},
		{"xoxb-123456789012-1234567890123-AbCdEfGhIjKl", "AbCdEfGhIjKl", ""},
		{"xoxp-1-2-3", "xoxp-1-2-3", ""},
		{"xoxa-2-abc", "xoxa-2-abc", ""},
		{"xoxs-abc-def", "xoxs-abc-def", ""},
		{"xapp-1-A0-123-abcdef", "xapp-1-A0-123-abcdef", ""},
		{`Post "https://hooks.slack.com/services/T000/B000/XXXXSECRET": dial tcp: i/o timeout`, "XXXXSECRET", "i/o timeout"},
		{"postgres://billing:s3cr3t@db:5432/billing?sslmode=require", "s3cr3t", "postgres://billing:"},
		{"postgresql://u:p%40ss@h/db", "p%40ss", "h/db"},
		{"redis://:hunter2@cache:6379/0", "hunter2", "cache:6379"},
		{"rediss://default:hunter2@cache:6380", "hunter2", "default"},
		{"host=db user=billing password=hunter2 dbname=x", "hunter2", "dbname=x"},
		{"Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "Authorization"},
		{"api_key=abc123secret", "abc123secret", ""},
		{"card 4242 4242 4242 4242 declined", "4242 4242 4242 4242", "declined"},
		{"card 4000-0566-5566-5556", "4000-0566-5566-5556", ""},
		{"pan 5555555555554444", "5555555555554444", ""},
		{"amex 3782 822463 10005", "822463", ""},
		{"amex 378282246310005.", "378282246310005", "."},
	}
	for _, c := range cases {
		got := Redact(c.in)
		if strings.Contains(got, c.gone) {
			t.Errorf("Redact(%q) = %q: %q survived", c.in, got, c.gone)
		}
		if c.keeping != "" && !strings.Contains(got, c.keeping) {
			t.Errorf("Redact(%q) = %q: lost %q", c.in, got, c.keeping)
		}
	}
	// Things that look alike but are not secrets stay readable.
	for _, keep := range []string{
		"charge ch_3MtwBwLkdIwHu7ix28a3tqPa for cus_ABC",
		"run 1700000000123 at 1764500000",
		"entry 1700000000000-0 idle 90000ms",
		"order 1234567890123",
		"stream id 1764500000004-0 and 4242424242424242-0",
		"ms 1764500000004",
		"auditor refund --run 7 --max-amount 100000",
	} {
		if got := Redact(keep); got != keep {
			t.Errorf("Redact(%q) = %q, want it unchanged", keep, got)
		}
	}
	if Redact(Redact("sk_live_abc")) != Redact("sk_live_abc") {
		t.Errorf("Redact is not idempotent")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	const hook = "http://hooks.example.com/services/T/B/SECRETPATH"
	cases := []struct {
		name string
		cfg  Config
		want string // substring of the error; empty means valid
	}{
		{"empty is log-only", Config{}, ""},
		{"token without channel", Config{BotToken: "xoxb-1"}, "set SLACK_CHANNEL"},
		{"channel without token", Config{Channel: "C1"}, "SLACK_BOT_TOKEN"},
		{"bot", Config{BotToken: "xoxb-1", Channel: "C1"}, ""},
		{"https webhook", Config{WebhookURL: "https://hooks.slack.com/services/T/B/X"}, ""},
		{"http loopback webhook", Config{WebhookURL: "http://127.0.0.1:8080/services/T/B/X"}, ""},
		{"http localhost webhook", Config{WebhookURL: "http://localhost:8080/x"}, ""},
		{"http remote webhook", Config{WebhookURL: hook}, "https"},
		{"not a URL", Config{WebhookURL: "hooks.slack.com/services"}, "SLACK_WEBHOOK_URL"},
		{"negative queue", Config{QueueSize: -1}, "negative"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: Validate = %v, want nil", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: Validate = %v, want an error containing %q", c.name, err, c.want)
		case err != nil && strings.Contains(err.Error(), "SECRETPATH"):
			t.Errorf("%s: the error shows the webhook URL: %v", c.name, err)
		}
	}
	if _, err := New(Config{BotToken: "xoxb-1"}); err == nil {
		t.Errorf("New accepted a token without a channel")
	}
}

func TestNewChoosesImplementation(t *testing.T) {
	t.Parallel()
	n, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.(*Log); !ok {
		t.Errorf("New(empty) = %T, want *Log", n)
	}
	cfg := withEnv(Config{Channel: "C_FLAG"}, func(k string) string {
		return map[string]string{"SLACK_BOT_TOKEN": " xoxb-env ", "SLACK_CHANNEL": "C_ENV", "SLACK_WEBHOOK_URL": ""}[k]
	})
	if cfg.BotToken != "xoxb-env" || cfg.Channel != "C_FLAG" {
		t.Errorf("withEnv = token %q channel %q, want the env token and the flag's channel", cfg.BotToken, cfg.Channel)
	}
	var buf syncBuffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "cfg", Config{BotToken: "xoxb-secret-1", WebhookURL: "https://hooks.slack.com/services/X"})
	if strings.Contains(buf.String(), "xoxb-secret-1") || strings.Contains(buf.String(), "services/X") {
		t.Errorf("logging a Config shows a credential: %s", buf.String())
	}
}

func TestLogNotifier(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	l := NewLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	l.Notify(StripeLookupFailed("c_1", "2026-11", "GET https://api.stripe.com with sk_live_abcdef123: timeout"))
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "stripe_lookup_failed") || strings.Contains(out, "sk_live_abcdef123") {
		t.Errorf("log = %s, want the kind and no key", out)
	}
	if got := l.Stats().Sent; got != 1 {
		t.Errorf("sent = %d, want 1", got)
	}
}

func TestDeadLetterAggregator(t *testing.T) {
	t.Parallel()
	clock := newFakeClock(false)
	mem := NewMemory()
	agg := NewDeadLetterAggregator(mem, time.Minute, clock)
	t.Cleanup(func() { _ = agg.Stop(context.Background()) })

	for i := range 25 {
		agg.Add("billing", "invalid_amount", "1700000000000-"+string(rune('a'+i)), "c_1")
	}
	agg.Add("billing", "spend_cap", "1700000000001-0", "c_2")
	agg.Add("billing-eu", "non_json", "1700000000002-0", "")

	clock.WaitWaiters(t, 1)
	clock.Advance(time.Minute)
	got, err := mem.Wait(waitCtx(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	billing := got[0]
	if billing.Kind != KindDeadLetters || !strings.Contains(billing.Title, "26 events") {
		t.Errorf("billing alert title = %q, want 26 events", billing.Title)
	}
	if len(billing.Items) != maxDeadLetterExamples {
		t.Errorf("examples = %d, want %d", len(billing.Items), maxDeadLetterExamples)
	}
	fields := map[string]string{}
	for _, f := range billing.Fields {
		fields[f.Label] = f.Value
	}
	if fields["invalid_amount"] != "25" || fields["spend_cap"] != "1" {
		t.Errorf("counts by reason = %v", fields)
	}
	if !strings.Contains(got[1].Title, "billing-eu") {
		t.Errorf("second alert = %q, want billing-eu", got[1].Title)
	}

	// Nothing added: the next tick sends nothing. Stop flushes the rest.
	if n := agg.Flush(); n != 0 {
		t.Errorf("empty flush sent %d alerts", n)
	}
	agg.Add("billing", "oversized", "1-1", "c_3")
	if err := agg.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := agg.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if got := mem.Alerts(); len(got) != 3 || !strings.Contains(got[2].Title, "1 event dead-lettered") {
		t.Errorf("after Stop: %d alerts, last %q", len(got), got[len(got)-1].Title)
	}
}

func TestConstructors(t *testing.T) {
	t.Parallel()
	for _, a := range []Alert{
		SpendCapReached("2026-11", 100_000_00, 99_990_00, 25_00, "c_<!channel>"),
		ReaperAnomaly("max_deliveries", "billing", "charge", "host-1-abc", "1700000000000-0", "delivered 10 times"),
		ReaperAnomaly("growing_pel", "billing", "charge", "host-1-abc", "", "PEL grew from 10 to 500"),
		ChargeFailed("c_1", "2026-11", "amount_too_large"),
		StripeLookupFailed("c_1", "2026-11", "timeout"),
		PermissionDenied("rk_ key lacks charges:write"),
		DeadLetters(DeadLetterInput{Stream: "billing", CountsByReason: map[string]int{"x": 1}}),
	} {
		if a.Kind == "" || a.Title == "" || a.Text == "" {
			t.Errorf("%+v lacks kind, title or text", a)
		}
		m := render(a, false)
		if m.Text == "" || len(m.Blocks) < 2 {
			t.Errorf("%s renders to %d blocks, text %q", a.Kind, len(m.Blocks), m.Text)
		}
		if strings.Contains(m.Text, "<!channel>") {
			t.Errorf("%s: a customer ID became a mention: %q", a.Kind, m.Text)
		}
	}
	if got := Money(2500, ""); got != "25.00 USD" {
		t.Errorf("Money(2500) = %q", got)
	}
	if got := Money(1500, "KWD"); got != "1.500 KWD" {
		t.Errorf("Money(1500, KWD) = %q", got)
	}
	if got := Money(-2505, "eur"); got != "-25.05 EUR" {
		t.Errorf("Money(-2505, eur) = %q", got)
	}
	if got := Money(500, "jpy"); got != "500 JPY" {
		t.Errorf("Money(500, jpy) = %q", got)
	}
	in := AuditSummaryInput{RunID: 3, DuplicateByCurrency: map[string]int64{"usd": 2500, "eur": 1000}}
	if s := AuditSummary(in); !strings.Contains(s.Text, "10.00 EUR + 25.00 USD") {
		t.Errorf("per-currency total missing: %q", s.Text)
	}
	if s := AuditSummary(AuditSummaryInput{RunID: 4, RefundCommand: "auditor refund"}); s.Command != "" || !strings.Contains(s.Title, "0 new findings") {
		t.Errorf("empty run: %+v", s)
	}
}
