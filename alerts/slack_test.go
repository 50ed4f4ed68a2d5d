package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pelguard/pelguard/alerts/slacktest"
)

// blocksOf decodes a recorded message's blocks into generic maps.
func blocksOf(t *testing.T, m slacktest.Message) []map[string]any {
	t.Helper()
	var blocks []map[string]any
	if err := json.Unmarshal(m.Blocks, &blocks); err != nil {
		t.Fatalf("decoding blocks %q: %v", m.Blocks, err)
	}
	return blocks
}

// sectionTexts returns the mrkdwn text of every section and field.
func sectionTexts(blocks []map[string]any) []string {
	var out []string
	for _, b := range blocks {
		if txt, ok := b["text"].(map[string]any); ok {
			out = append(out, fmt.Sprint(txt["text"]))
		}
		if fields, ok := b["fields"].([]any); ok {
			for _, f := range fields {
				out = append(out, fmt.Sprint(f.(map[string]any)["text"]))
			}
		}
	}
	return out
}

func TestDelivery(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			n := b.start(t)
			n.Notify(ChargeFailed("c_42", "2026-11", "card_declined: do_not_honor"))

			msgs, err := b.rec.WaitMessages(waitCtx(t), 1)
			if err != nil {
				t.Fatal(err)
			}
			m := msgs[0]
			if !strings.Contains(m.Text, "Charge failed") || !strings.Contains(m.Text, "c_42") {
				t.Errorf("fallback text = %q, want title and customer", m.Text)
			}
			blocks := blocksOf(t, m)
			if blocks[0]["type"] != "header" {
				t.Errorf("first block = %v, want a header", blocks[0]["type"])
			}
			if mode == "bot" && m.Channel != "C0TEST" {
				t.Errorf("channel = %q, want C0TEST", m.Channel)
			}
			if err := n.Close(waitCtx(t)); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if got := n.Stats(); got.Sent != 1 || got.Failed != 0 {
				t.Errorf("stats = %+v, want 1 sent", got)
			}
			if got := counter(t, b.reg, "pelguard_alerts_sent_total", "kind", string(KindChargeFailed)); got != 1 {
				t.Errorf("pelguard_alerts_sent_total{kind=charge_failed} = %v, want 1", got)
			}
		})
	}
}

func auditInput(findings int) AuditSummaryInput {
	in := AuditSummaryInput{
		RunID:             7,
		From:              time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		To:                time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC),
		NewFindingsByKind: map[string]int{"duplicate_charge": findings},
		RefundCommand:     "auditor refund --run 7 --max-amount 100000",
	}
	for i := range findings {
		in.Findings = append(in.Findings, FindingInfo{
			ID: int64(i + 1), Kind: "duplicate_charge", CustomerID: fmt.Sprintf("c_%d", i),
			Period: "2026-11", ChargeIDs: []string{fmt.Sprintf("ch_%da", i), fmt.Sprintf("ch_%db", i)},
			AmountCents: 2500, Currency: "usd",
		})
		in.DuplicateCents += 2500
	}
	return in
}

func TestBotThreadsFindingsUnderSummary(t *testing.T) {
	t.Parallel()
	b := setup(t, "bot")
	n := b.start(t)
	n.Notify(AuditSummary(auditInput(3)))

	msgs, err := b.rec.WaitMessages(waitCtx(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	summary := msgs[0]
	if summary.ThreadTS != "" {
		t.Fatalf("summary posted in a thread (%q)", summary.ThreadTS)
	}
	if !strings.Contains(summary.Text, "audit run #7") || !strings.Contains(summary.Text, "75.00 USD") {
		t.Errorf("summary fallback = %q, want run and amount", summary.Text)
	}
	for i, reply := range msgs[1:] {
		if reply.ThreadTS != summary.TS {
			t.Errorf("reply %d thread_ts = %q, want the summary's ts %q", i, reply.ThreadTS, summary.TS)
		}
		if !strings.Contains(reply.Text, fmt.Sprintf("c_%d", i)) {
			t.Errorf("reply %d text = %q, want finding %d", i, reply.Text, i)
		}
	}
	// One message per second per channel: each reply waited its second.
	var waited time.Duration
	for _, d := range b.clock.Sleeps() {
		waited += d
	}
	if waited < 3*time.Second {
		t.Errorf("waited %v on the clock for 4 messages, want ≥ 3s (1/s rate limit)", waited)
	}
}

func TestWebhookShowsTopFindingsInline(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	n := b.start(t)
	n.Notify(AuditSummary(auditInput(12)))
	msgs, err := b.rec.WaitMessages(waitCtx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(sectionTexts(blocksOf(t, msgs[0])), "\n")
	for _, want := range []string{"c_9", "… and 2 more", "auditor refund --run 7", "duplicate_charge", "300.00 USD"} {
		if !strings.Contains(all, want) {
			t.Errorf("summary blocks lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "c_10`") {
		t.Errorf("summary shows more than 10 findings:\n%s", all)
	}
	if err := n.Close(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := len(b.rec.Requests()); got != 1 {
		t.Errorf("webhook got %d requests, want 1 (no thread replies without a ts)", got)
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			b.rec.Fail(1, http.StatusTooManyRequests, "7")
			n := b.start(t)
			n.Notify(PermissionDenied("rk_ key lacks charges:read"))

			if _, err := b.rec.WaitMessages(waitCtx(t), 1); err != nil {
				t.Fatal(err)
			}
			if err := n.Close(waitCtx(t)); err != nil {
				t.Fatal(err)
			}
			if got := len(b.rec.Requests()); got != 2 {
				t.Errorf("requests = %d, want 429 then success", got)
			}
			sleeps := b.clock.Sleeps()
			if len(sleeps) == 0 || sleeps[0] != 7*time.Second {
				t.Errorf("clock waits = %v, want the Retry-After of 7s first", sleeps)
			}
			if got := n.Stats(); got.Sent != 1 || got.Retries != 1 || got.Failed != 0 {
				t.Errorf("stats = %+v, want 1 sent after 1 retry", got)
			}
		})
	}
}

func TestServerErrorsUntilGiveUp(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			b.rec.Always(&slacktest.Response{Status: http.StatusInternalServerError})
			n := b.start(t)
			n.Notify(ChargeFailed("c_1", "2026-11", "boom"))
			if err := n.Close(waitCtx(t)); err != nil {
				t.Fatal(err)
			}
			if got := len(b.rec.Requests()); got != b.cfg.MaxAttempts {
				t.Errorf("requests = %d, want MaxAttempts = %d", got, b.cfg.MaxAttempts)
			}
			if got := n.Stats(); got.Failed != 1 || got.Sent != 0 || got.Retries != int64(b.cfg.MaxAttempts-1) {
				t.Errorf("stats = %+v, want 1 failed after %d retries", got, b.cfg.MaxAttempts-1)
			}
			if got := counter(t, b.reg, "pelguard_alerts_failed_total", "kind", string(KindChargeFailed)); got != 1 {
				t.Errorf("pelguard_alerts_failed_total = %v, want 1", got)
			}
			// Backoff grows: the second wait is drawn from a larger range.
			for _, d := range b.clock.Sleeps() {
				if d < b.cfg.BaseBackoff/2 || d > b.cfg.MaxBackoff {
					t.Errorf("backoff %v outside [%v, %v]", d, b.cfg.BaseBackoff/2, b.cfg.MaxBackoff)
				}
			}
			if !strings.Contains(b.logs.String(), "giving up") {
				t.Errorf("give-up not logged:\n%s", b.logs)
			}
		})
	}
}

func TestPermanentAPIErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, "bot")
	b.rec.Always(&slacktest.Response{APIError: "channel_not_found"})
	n := b.start(t)
	n.Notify(ChargeFailed("c_1", "2026-11", "boom"))
	if err := n.Close(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := len(b.rec.Requests()); got != 1 {
		t.Errorf("requests = %d, want 1: channel_not_found needs a human", got)
	}
	if got := n.Stats(); got.Failed != 1 {
		t.Errorf("stats = %+v, want 1 failed", got)
	}
}

func TestDedupeWithinTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	b.cfg.DedupeTTL = 10 * time.Minute
	n := b.start(t)
	a := SpendCapReached("2026-11", 100_00, 95_00, 25_00, "c_1")

	n.Notify(a)
	if _, err := b.rec.WaitMessages(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	n.Notify(a)
	n.Notify(a)
	if got := n.Stats().Deduped; got != 2 {
		t.Errorf("deduped = %d, want 2", got)
	}
	if got := counter(t, b.reg, "pelguard_alerts_dropped_total", "reason", DropDeduped); got != 2 {
		t.Errorf("pelguard_alerts_dropped_total{reason=deduped} = %v, want 2", got)
	}

	b.clock.Advance(10*time.Minute + time.Second)
	n.Notify(a)
	if _, err := b.rec.WaitMessages(waitCtx(t), 2); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := len(b.rec.Requests()); got != 2 {
		t.Errorf("requests = %d, want 2 (once, then again after the TTL)", got)
	}
}

func TestFailedAlertIsNotDeduped(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	b.cfg.MaxAttempts = 1
	b.rec.Fail(1, http.StatusInternalServerError, "")
	n := b.start(t)
	a := ChargeFailed("c_1", "2026-11", "x")
	n.Notify(a)
	if _, err := b.rec.WaitRequests(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	// One worker delivers in order: once a later alert is through, the
	// first one's failure has been accounted for.
	n.Notify(ChargeFailed("c_2", "2026-11", "x"))
	if _, err := b.rec.WaitMessages(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	n.Notify(a)
	if _, err := b.rec.WaitMessages(waitCtx(t), 2); err != nil {
		t.Fatalf("an alert that failed must get through on its next occurrence: %v", err)
	}
}

func TestLargeSummaryIsTruncated(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	n := b.start(t)
	n.Notify(AuditSummary(auditInput(500)))
	msgs, err := b.rec.WaitMessages(waitCtx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, msgs[0])
	checkLimits(t, blocks)
	if all := strings.Join(sectionTexts(blocks), "\n"); !strings.Contains(all, "… and 490 more") {
		t.Errorf("want \"… and 490 more\" in:\n%s", all)
	}
}

func checkLimits(t *testing.T, blocks []map[string]any) {
	t.Helper()
	if len(blocks) > maxBlocks {
		t.Errorf("%d blocks, Slack allows %d", len(blocks), maxBlocks)
	}
	for _, s := range sectionTexts(blocks) {
		if n := utf8.RuneCountInString(s); n > maxSectionText {
			t.Errorf("section of %d characters, Slack allows %d", n, maxSectionText)
		}
	}
}

func TestRenderWithinSlackLimits(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 2000)
	a := Alert{Kind: "test", Title: strings.Repeat("T", 400), Text: strings.Repeat("line of text\n", 1000)}
	for i := range 500 {
		a.Items = append(a.Items, Item{Text: fmt.Sprintf("item %d %s", i, long)})
	}
	a.Items = append(a.Items, Item{Text: strings.Repeat("y", 10_000)})
	a.Command = "auditor refund " + strings.Repeat("--x ", 2000)
	m := render(a, false)
	raw, err := json.Marshal(m.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, slacktest.Message{Blocks: raw})
	checkLimits(t, blocks)
	all := strings.Join(sectionTexts(blocks), "\n")
	if !strings.Contains(all, "more line") {
		t.Errorf("long text not cut with a count")
	}
	if !strings.Contains(all, "… and ") || !strings.Contains(all, " more") {
		t.Errorf("items not cut with \"… and N more\"")
	}
	if !strings.Contains(all, "auditor refund") {
		t.Errorf("the command was pushed out by the items")
	}
	if n := utf8.RuneCountInString(m.Text); n > maxFallbackText {
		t.Errorf("fallback of %d characters", n)
	}
	hdr := blocks[0]["text"].(map[string]any)["text"].(string)
	if n := utf8.RuneCountInString(hdr); n > maxHeaderText {
		t.Errorf("header of %d characters, Slack allows %d", n, maxHeaderText)
	}
}

func TestHangingSlackNeverBlocksNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	b.rec.HangAll()
	b.cfg.QueueSize = 16
	n := b.start(t)

	const calls = 10_000
	start := time.Now()
	for i := range calls {
		n.Notify(ChargeFailed(fmt.Sprintf("c_%d", i), "2026-11", "x"))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("%d Notify calls took %v with Slack hanging", calls, d)
	}
	// At most the queue plus the one in flight were accepted.
	if got := n.Stats().Dropped; got < calls-int64(b.cfg.QueueSize)-1 {
		t.Errorf("dropped = %d, want ≥ %d", got, calls-b.cfg.QueueSize-1)
	}
	if got := counter(t, b.reg, "pelguard_alerts_dropped_total", "reason", DropQueueFull); got < calls-float64(b.cfg.QueueSize)-1 {
		t.Errorf("pelguard_alerts_dropped_total{reason=queue_full} = %v", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	closeStart := time.Now()
	err := n.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(closeStart); d > 2*time.Second {
		t.Errorf("Close took %v with a 100ms ctx", d)
	}
	if got := n.Stats(); got.Sent != 0 || got.Dropped+got.Failed != calls {
		// Every alert is accounted for: dropped (queue_full or shutdown) or
		// failed (the one in flight).
		t.Errorf("stats = %+v, want every alert dropped but the one in flight", got)
	}
	n.Notify(ChargeFailed("c_late", "2026-11", "x"))
	if got := counter(t, b.reg, "pelguard_alerts_dropped_total", "reason", DropClosed); got != 1 {
		t.Errorf("Notify after Close: dropped{closed} = %v, want 1", got)
	}
}

func TestNoSecretReachesSlackOrLogs(t *testing.T) {
	t.Parallel()
	secrets := []string{
		"sk_live_51HqLyjWDarjtT1zdp7dcXYZabc",
		"rk_test_51HqLyjWDarjtT1zdp7dcXYZabc",
		"pk_live_51HqLyjWDarjtT1zdp7dcXYZabc",
		"xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
		"xoxp-1234-5678-abcdef",
		"https://hooks.slack.com/services/T0000/B0000/SecretSecretSecret",
		"hunter2pass",
		"4242424242424242",
	}
	planted := strings.Join([]string{
		"key " + secrets[0], "restricted " + secrets[1], "pub " + secrets[2], "bot " + secrets[3],
		"user " + secrets[4], "hook " + secrets[5],
		"db postgres://billing:hunter2pass@db:5432/billing redis redis://:hunter2pass@cache:6379/0",
		"card 4242 4242 4242 4242",
	}, "; ")
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			b.rec.Fail(1, http.StatusInternalServerError, "")
			n := b.start(t)
			a := Alert{
				Kind: "test", Title: "title " + planted, Text: planted,
				Fields: []Field{{Label: "f", Value: planted}}, Items: []Item{{Text: planted}},
				ThreadItems: true, Command: "auditor refund --db " + planted,
			}
			n.Notify(a)
			n.Notify(StripeLookupFailed("c_1", "2026-11", planted))
			n.Notify(AuditSummary(AuditSummaryInput{RunID: 1, RefundCommand: planted,
				Findings: []FindingInfo{{ID: 1, Kind: "duplicate_charge", CustomerID: planted}}}))
			if err := n.Close(waitCtx(t)); err != nil {
				t.Fatal(err)
			}
			reqs := b.rec.Requests()
			if len(reqs) < 4 {
				t.Fatalf("only %d requests", len(reqs))
			}
			for _, r := range reqs {
				body := strings.ReplaceAll(r.Body, "token="+testToken, "") // the bot's own credential field
				for _, s := range secrets {
					if strings.Contains(body, s) || strings.Contains(body, strings.ReplaceAll(s, "/", `\/`)) {
						t.Errorf("request body contains %q", s)
					}
				}
				if !strings.Contains(body, "REDACTED") {
					t.Errorf("body shows no redaction: %s", body)
				}
			}
			logs := b.logs.String()
			for _, s := range append(secrets, testToken, b.rec.WebhookURL()) {
				if strings.Contains(logs, s) {
					t.Errorf("logs contain %q", s)
				}
			}
		})
	}
}

func TestManyFieldsStayWithinLimits(t *testing.T) {
	t.Parallel()
	a := Alert{Kind: "test", Title: "t", Command: "auditor refund --run 1"}
	for i := range 600 {
		a.Fields = append(a.Fields, Field{Label: fmt.Sprintf("reason_%d", i), Value: "1"})
		a.Items = append(a.Items, Item{Text: strings.Repeat("z", 2500)})
	}
	raw, err := json.Marshal(render(a, false).Blocks)
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, slacktest.Message{Blocks: raw})
	checkLimits(t, blocks)
	all := strings.Join(sectionTexts(blocks), "\n")
	for _, want := range []string{"and 551 more", "auditor refund --run 1", "… and "} {
		if !strings.Contains(all, want) {
			t.Errorf("blocks lack %q", want)
		}
	}
}

func TestNotifyRacingClose(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	n := b.start(t)
	const goroutines, each = 8, 200
	done := make(chan struct{})
	for g := range goroutines {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range each {
				n.Notify(ChargeFailed(fmt.Sprintf("c_%d_%d", g, i), "2026-11", "x"))
			}
		}()
	}
	closeErr := n.Close(waitCtx(t))
	for range goroutines {
		<-done
	}
	if closeErr != nil {
		t.Fatalf("Close: %v", closeErr)
	}
	// Every alert is accounted for exactly once.
	got := n.Stats()
	if total := got.Sent + got.Failed + got.Dropped; total != goroutines*each {
		t.Errorf("stats = %+v: %d accounted for, want %d", got, total, goroutines*each)
	}
	if int(got.Sent) != len(b.rec.Messages()) {
		t.Errorf("sent = %d, recorder has %d", got.Sent, len(b.rec.Messages()))
	}
}

func TestRateLimitedWithoutRetryAfterBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t, "webhook")
	b.rec.Fail(2, http.StatusTooManyRequests, "")
	n := b.start(t)
	n.Notify(ChargeFailed("c_1", "2026-11", "x"))
	if _, err := b.rec.WaitMessages(waitCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := n.Stats(); got.Sent != 1 || got.Retries != 2 {
		t.Errorf("stats = %+v, want sent after 2 retries", got)
	}
}

func TestWebhookURLNeverLogged(t *testing.T) {
	t.Parallel()
	gone := slacktest.NewRecorder()
	url := gone.WebhookURL()
	gone.Close() // connection refused from now on: net/http's error names the URL
	b := setup(t, "webhook")
	b.cfg.WebhookURL = url
	n := b.start(t)
	n.Notify(ChargeFailed("c_1", "2026-11", "x"))
	if err := n.Close(waitCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got := n.Stats(); got.Failed != 1 || got.Retries != int64(b.cfg.MaxAttempts-1) {
		t.Errorf("stats = %+v, want a network error retried then given up", got)
	}
	logs := b.logs.String()
	if strings.Contains(logs, "/services/") || !strings.Contains(logs, "[webhook URL]") {
		t.Errorf("logs show the webhook URL or no error at all:\n%s", logs)
	}
}
