package console

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
	"github.com/pelguard/pelguard/stripeapi"
)

// ingest records events queued in the meter ledger, as a meter consumer
// with --send-from-ledger does at ingest.
func (w *meterWorld) ingest(stream, cust string, ts time.Time, values ...int64) []meterledger.Record {
	w.t.Helper()
	var reqs []meterledger.IngestRequest
	for _, v := range values {
		w.seq++
		ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: cust, Value: v, Timestamp: ts, EventID: fmt.Sprintf("e%d", w.seq)}
		reqs = append(reqs, meterledger.IngestRequest{Request: meterledger.Request{Event: ev, Identifier: ev.Identifier(testNS),
			MessageID: fmt.Sprintf("1-%d", w.seq)}, Stream: stream, Fields: map[string]any{event.PayloadField: ev.Payload()}})
	}
	got, err := w.meters.Ingest(context.Background(), reqs)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []meterledger.Record
	for _, g := range got {
		if g.Decision != meterledger.Queued {
			w.t.Fatalf("ingest: %v %s", g.Decision, g.Reason)
		}
		out = append(out, g.Record)
	}
	return out
}

// aggregate forms the aggregate of cust's queued events of ts's second,
// sends it to the emulator and records it delivered with its members.
func (w *meterWorld) aggregate(stream, cust string, ts time.Time) meterledger.Aggregate {
	w.t.Helper()
	ctx := context.Background()
	// The group's ingest watermark just past ts's second: its bucket is formed.
	a, members, ok, err := w.meters.FormAggregate(ctx, testNS, stream, "api_requests", cust, time.Unix(ts.Unix()+1, 0), time.Second, "test", time.Minute)
	if err != nil || !ok || len(members) == 0 {
		w.t.Fatalf("forming the aggregate: ok=%v %v", ok, err)
	}
	if _, err := w.cfg.Stripe.SendMeterEvent(ctx, stripeapi.MeterEvent{EventName: a.EventName, StripeCustomerID: cust, Value: a.Value,
		Identifier: a.Identifier, Timestamp: a.Second}); err != nil {
		w.t.Fatal(err)
	}
	if res, err := w.meters.FinishAggregate(ctx, a, meterledger.Delivered, ""); err != nil || res != meterledger.Delivered {
		w.t.Fatalf("finishing the aggregate: %v %v", res, err)
	}
	return a
}

var meterRowRe = regexp.MustCompile(`(?s)<tr data-status="([a-z]+)"(?: data-aggregate="([^"]+)")?>(.*?)</tr>`)

// With --send-from-ledger, a usage event is recorded queued and its entry
// acked: the pages show the ledger's backlog and say truthfully what a
// queued row is (recorded, not sent yet: neither pending at Stripe nor
// failed), and an aggregate member names the aggregate that carried it
// and that call's status.
func TestPagesShowTheLedgerBacklogAndAggregates(t *testing.T) {
	t.Parallel()
	usage := testenv.Name(t, "usage")
	w := setupMeters(t, func(c *Config) {
		c.Streams = append(c.Streams, Stream{Name: usage, Group: "meters", Meter: true})
	})
	testenv.CleanupKeys(t, w.rdb, usage)
	if err := w.rdb.XGroupCreateMkStream(context.Background(), usage, "meters", "$").Err(); err != nil {
		t.Fatal(err)
	}
	at := w.clk.Now().Add(-2 * time.Minute).Truncate(time.Second)
	w.ingest(usage, "cus_q", at, 3, 4, 5)
	w.tick(3 * time.Minute) // the oldest queued event waits 3 minutes
	w.ingest(usage, "cus_a", at.Add(400*time.Millisecond), 2, 6)
	a := w.aggregate(usage, "cus_a", at)
	c := w.login(t, "alice")

	page := c.mustGet("/meter-events?customer=cus_q")
	rows := meterRowRe.FindAllStringSubmatch(page, -1)
	if len(rows) != 3 {
		t.Fatalf("%d rows of cus_q, want 3", len(rows))
	}
	for _, r := range rows {
		text := strings.Join(strings.Fields(tagOrSpan.ReplaceAllString(r[3], " ")), " ")
		if r[1] != "queued" || !strings.Contains(text, "not sent yet") || strings.Contains(text, "failed") {
			t.Errorf("a queued row reads %q (status %s): want it said recorded, not sent yet", text, r[1])
		}
	}
	for _, s := range []string{"3 queued", "12 units", "3m ago", "recorded, not sent yet"} {
		if !strings.Contains(page, s) {
			t.Errorf("cus_q's meter events lack the backlog's %q", s)
		}
	}
	page = c.mustGet("/meter-events?customer=cus_a")
	rows = meterRowRe.FindAllStringSubmatch(page, -1)
	if len(rows) != 2 {
		t.Fatalf("%d rows of cus_a, want 2", len(rows))
	}
	for _, r := range rows {
		text := strings.Join(strings.Fields(tagOrSpan.ReplaceAllString(r[3], " ")), " ")
		if r[1] != "delivered" || r[2] != a.Identifier || !strings.Contains(text, "in aggregate "+a.Identifier) ||
			!strings.Contains(text, "delivered , 2 events, sum 8") {
			t.Errorf("an aggregate member reads %q (status %s, aggregate %q): want its aggregate %s named, delivered, 2 events, sum 8",
				text, r[1], r[2], a.Identifier)
		}
	}
	if !strings.Contains(page, "Nothing of cus_a is waiting to be sent") {
		t.Error("cus_a has nothing queued: its page should say so")
	}

	page = c.mustGet("/usage?customer=cus_q")
	m := comparedRowRe.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no meter row on cus_q's Usage page")
	}
	text := strings.Join(strings.Fields(tagOrSpan.ReplaceAllString(m[3], " ")), " ")
	if !strings.Contains(text, "3 queued") || !strings.Contains(text, "oldest recorded 3m ago") {
		t.Errorf("cus_q's meter row reads %q: want its backlog, 3 queued, the oldest 3m", text)
	}

	page = c.mustGet("/pel?stream=" + usage)
	for _, s := range []string{"Ledger backlog of " + usage, "3 queued", "1 customer-meter;"} {
		if !strings.Contains(page, s) {
			t.Errorf("the meter stream's PEL page lacks %q", s)
		}
	}
	if strings.Contains(page, "nothing queued") {
		t.Error("the PEL page says nothing is queued")
	}
	page = c.mustGet("/")
	if !strings.Contains(page, "3 queued") {
		t.Error("the overview's streams panel lacks the meter stream's ledger backlog")
	}
	// A meter stream's replay says what a meter consumer does with it.
	for _, q := range []string{"id=1-0", "reason=meter_event_refused"} {
		page = c.mustGet("/dead/confirm?stream=" + usage + "&" + q)
		if strings.Contains(page, "final row for its customer and period") || !strings.Contains(page, "queued") ||
			!strings.Contains(page, "sent under its identifier") || !strings.Contains(page, "meter_replay_refused") {
			t.Errorf("the replay confirmation of a meter stream (%s) does not say what a meter consumer does", q)
		}
	}
}
