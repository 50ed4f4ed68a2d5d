// Package alerts tells people about money going wrong: duplicate charges the
// auditor found, dead-lettered events, spend caps reached, reaper anomalies,
// Stripe failures. A duplicate charge nobody hears about is a support ticket a
// week later.
//
// A Notifier never blocks billing code: Notify puts the alert on a bounded
// queue and returns; a full queue drops the alert, logs it and counts it.
// One worker per notifier delivers to Slack (incoming webhook, or bot token +
// channel) with a per-channel rate limit, retries with backoff and jitter,
// honours Retry-After on 429, and suppresses duplicates by fingerprint.
// Every outgoing text passes through Redact.
package alerts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/pelguard/pelguard/internal/cmdname"
	"github.com/pelguard/pelguard/stripeapi"
)

// Notifier delivers alerts. Implementations are safe for concurrent use.
type Notifier interface {
	// Notify queues a and returns at once; it never blocks and never fails.
	// An alert that cannot be queued is dropped, logged and counted.
	Notify(a Alert)
	// Close stops accepting alerts and delivers what is queued, giving up
	// (and counting the rest as dropped) when ctx is done.
	Close(ctx context.Context) error
}

// Kind names what an alert is about; it is the "kind" label of the metrics.
type Kind string

// The kinds of alert pelguard sends.
const (
	// KindAuditSummary: an auditor run found new findings; the message
	// lists them and the exact refund command.
	KindAuditSummary Kind = "audit_summary"
	// KindAuditFinding: one finding sent on its own (a thread reply of the
	// summary).
	KindAuditFinding Kind = "audit_finding"
	// KindDeadLetters: entries went to <stream>:dead in the last interval,
	// counted by reason; from every role that dead-letters (consumer run,
	// consumer meter-events, the reaper), one alert per stream and interval.
	KindDeadLetters Kind = "dead_letters"
	// KindSpendCap: a charge was not made because it would pass the
	// period's spend cap; the event is dead-lettered for replay.
	KindSpendCap Kind = "spend_cap"
	// KindReaperAnomaly: something the reaper will not fix by itself (an
	// entry past --max-deliveries, unregistered consumers).
	KindReaperAnomaly Kind = "reaper_anomaly"
	// KindChargeFailed: a permanent Stripe error on one customer, who was
	// not billed.
	KindChargeFailed Kind = "charge_failed"
	// KindStripeLookupFailed: a look-up before charging (past the key
	// window, an imported period) failed; nothing was charged.
	KindStripeLookupFailed Kind = "stripe_lookup_failed"
	// KindPermissionDenied: the Stripe key lacks a permission (403) or is
	// invalid or revoked (401).
	KindPermissionDenied Kind = "permission_denied"
	// KindChargeDeclined: a customer was not billed: a hard decline, the
	// last retry of a soft one, or a bank debit returned for good.
	KindChargeDeclined Kind = "charge_declined"
	// KindActionRequired: Stripe needs the customer (authentication, a
	// payment method) before it can charge.
	KindActionRequired Kind = "action_required"
	// KindLedgerRollback: Postgres lost ledger commits (a failover to an
	// asynchronous replica, a restore); the fleet fences and repairs.
	KindLedgerRollback Kind = "ledger_rollback"
	// KindLedgerRepaired: a rollback's repair from Stripe finished.
	KindLedgerRepaired Kind = "ledger_repaired"
	// KindStreamPaused: an operator paused (or resumed) billing from a
	// stream: nothing of it is sent to Stripe until it is resumed.
	KindStreamPaused Kind = "stream_paused"
)

// Field is a label/value pair shown side by side (Slack section fields).
type Field struct {
	Label string
	Value string
}

// Item is one line of a list (a finding, a dead-letter example), in Slack
// mrkdwn. With a bot token and Alert.ThreadItems, each item is also posted
// as a reply in the alert's thread.
type Item struct {
	Text string
}

// Alert is one message. Build it with the constructors of this package
// (AuditSummary, DeadLetters, ...) so that messages look alike; the renderer
// keeps it within Slack's limits and redacts every text.
type Alert struct {
	Kind  Kind
	Title string
	// Text is Slack mrkdwn; dynamic values should go through Escape.
	Text   string
	Fields []Field
	// ItemsTitle introduces Items, e.g. "Top findings".
	ItemsTitle string
	Items      []Item
	// InlineItems is how many Items the message shows before "… and N more";
	// 0 shows as many as fit in Slack's limits.
	InlineItems int
	// ThreadItems asks for every item to be posted as a reply in the
	// message's thread. Only the bot API returns the ts a thread needs; a
	// webhook shows the inline items only.
	ThreadItems bool
	// Command is shown verbatim in a code block (e.g. the refund command).
	Command string
	// Fingerprint identifies repeats: a second alert with the same
	// fingerprint within Config.DedupeTTL is dropped. Empty disables dedupe.
	Fingerprint string
}

// Escape makes s safe to embed in Slack mrkdwn: it escapes the three
// characters Slack uses for links and mentions, so that a customer ID cannot
// turn into <!channel>.
func Escape(s string) string {
	return mrkdwnEscaper.Replace(s)
}

var mrkdwnEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// code renders s as inline code, escaped and without backticks that would
// end the span early.
func code(s string) string {
	if s == "" {
		return "_none_"
	}
	return "`" + strings.ReplaceAll(Escape(s), "`", "'") + "`"
}

// FindingInfo is one audit finding as the summary shows it.
type FindingInfo struct {
	ID          int64
	Kind        string
	CustomerID  string
	Period      string
	ChargeIDs   []string
	AmountCents int64
	Currency    string
}

// AuditSummaryInput is what one auditor run reports.
type AuditSummaryInput struct {
	RunID int64
	From  time.Time
	To    time.Time
	// NewFindingsByKind counts the run's new findings per kind.
	NewFindingsByKind map[string]int
	// DuplicateCents is the total amount double-charged. When findings span
	// currencies, DuplicateByCurrency gives the split and takes precedence.
	DuplicateCents      int64
	DuplicateByCurrency map[string]int64
	// Findings are the new findings, most important first; the message shows
	// the first 10.
	Findings []FindingInfo
	// RefundCommand is the exact `auditor refund …` command to run.
	RefundCommand string
}

// summaryInlineFindings is how many findings the summary shows; the rest go
// to the thread (bot) or are counted in "… and N more".
const summaryInlineFindings = 10

// AuditSummary is the auditor's one message per run with its new findings.
func AuditSummary(s AuditSummaryInput) Alert {
	total := 0
	for _, n := range s.NewFindingsByKind {
		total += n
	}
	if total == 0 {
		total = len(s.Findings)
	}
	title := fmt.Sprintf("pelguard audit run #%d: %d new finding%s", s.RunID, total, plural(total))
	var b strings.Builder
	fmt.Fprintf(&b, "*Window:* %s → %s\n", fmtTime(s.From), fmtTime(s.To))
	fmt.Fprintf(&b, "*Double-charged:* %s", duplicateTotal(s))
	if total == 0 {
		b.WriteString("\nNothing new since the last run.")
	}

	var fields []Field
	for _, k := range sortedKeys(s.NewFindingsByKind) {
		fields = append(fields, Field{Label: k, Value: fmt.Sprint(s.NewFindingsByKind[k])})
	}
	items := make([]Item, 0, len(s.Findings))
	for _, f := range s.Findings {
		items = append(items, Item{Text: findingLine(f)})
	}
	a := Alert{
		Kind:        KindAuditSummary,
		Title:       title,
		Text:        b.String(),
		Fields:      fields,
		ItemsTitle:  "Findings",
		Items:       items,
		InlineItems: summaryInlineFindings,
		ThreadItems: true,
		Fingerprint: fmt.Sprintf("audit_summary:%d", s.RunID),
	}
	if s.RefundCommand != "" && total > 0 {
		a.Command = s.RefundCommand
	}
	return a
}

func findingLine(f FindingInfo) string {
	charges := make([]string, 0, len(f.ChargeIDs))
	for _, id := range f.ChargeIDs {
		charges = append(charges, code(id))
	}
	line := fmt.Sprintf("#%d *%s* customer %s period %s", f.ID, Escape(f.Kind), code(f.CustomerID), code(f.Period))
	if f.AmountCents != 0 {
		line += " " + Money(f.AmountCents, f.Currency)
	}
	if len(charges) > 0 {
		line += " charges " + strings.Join(charges, ", ")
	}
	return line
}

func duplicateTotal(s AuditSummaryInput) string {
	if len(s.DuplicateByCurrency) > 0 {
		parts := make([]string, 0, len(s.DuplicateByCurrency))
		for _, cur := range sortedKeys(s.DuplicateByCurrency) {
			parts = append(parts, Money(s.DuplicateByCurrency[cur], cur))
		}
		return strings.Join(parts, " + ")
	}
	// Without a split, take the currency from the duplicate findings when
	// they agree; Stripe amounts are meaningless without one.
	cur := ""
	for _, f := range s.Findings {
		if f.Kind != "duplicate_charge" || f.Currency == "" {
			continue
		}
		if cur != "" && !strings.EqualFold(cur, f.Currency) {
			return fmt.Sprintf("%d (minor units, mixed currencies)", s.DuplicateCents)
		}
		cur = f.Currency
	}
	return Money(s.DuplicateCents, cur)
}

// zeroDecimal lists Stripe's zero-decimal currencies, whose amounts are
// already in whole units.
var zeroDecimal = map[string]bool{
	"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true,
	"krw": true, "mga": true, "pyg": true, "rwf": true, "ugx": true, "vnd": true,
	"vuv": true, "xaf": true, "xof": true, "xpf": true,
}

// threeDecimal lists Stripe's three-decimal currencies: 1000 minor units
// of BHD are 1.000 BHD.
var threeDecimal = map[string]bool{"bhd": true, "jod": true, "kwd": true, "omr": true, "tnd": true}

// Money formats a Stripe amount in minor units, e.g. Money(2500, "usd") is
// "25.00 USD", Money(500, "jpy") "500 JPY", Money(1500, "kwd") "1.500 KWD".
// An empty currency means usd, as in the event format.
func Money(minor int64, currency string) string {
	cur := strings.ToLower(cmp.Or(currency, "usd"))
	if zeroDecimal[cur] {
		return fmt.Sprintf("%d %s", minor, strings.ToUpper(cur))
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	if threeDecimal[cur] {
		return fmt.Sprintf("%s%d.%03d %s", sign, minor/1000, minor%1000, strings.ToUpper(cur))
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, strings.ToUpper(cur))
}

// DeadLetterExample is one dead-lettered entry shown in the summary.
type DeadLetterExample struct {
	SourceID   string
	Reason     string
	CustomerID string
}

// DeadLetterInput is one interval's dead letters on one stream.
type DeadLetterInput struct {
	Stream         string
	CountsByReason map[string]int
	Examples       []DeadLetterExample
}

// DeadLetters reports the events that went to a dead-letter stream during
// one aggregation interval (see DeadLetterAggregator).
func DeadLetters(d DeadLetterInput) Alert {
	total := 0
	var fields []Field
	for _, r := range sortedKeys(d.CountsByReason) {
		total += d.CountsByReason[r]
		fields = append(fields, Field{Label: r, Value: fmt.Sprint(d.CountsByReason[r])})
	}
	items := make([]Item, 0, len(d.Examples))
	for _, e := range d.Examples {
		items = append(items, Item{Text: fmt.Sprintf("%s *%s* customer %s", code(e.SourceID), Escape(e.Reason), code(e.CustomerID))})
	}
	return Alert{
		Kind:  KindDeadLetters,
		Title: fmt.Sprintf("%d event%s dead-lettered on %s", total, plural(total), d.Stream),
		Text: fmt.Sprintf("Dead-letter stream %s. Nothing was charged or counted for these events; "+
			"fix the cause, then replay them (`"+cmdname.Consumer+" replay --stream %s --reason REASON`).", code(d.Stream+":dead"), d.Stream),
		Fields:      fields,
		ItemsTitle:  "Examples",
		Items:       items,
		InlineItems: 10,
	}
}

// SpendCapReached reports a charge that was not made because it would pass
// the period's spend cap. Repeats for the same period and cap are
// deduplicated: the other customers are in the dead-letter stream with
// reason spend_cap.
func SpendCapReached(period string, capCents, reservedCents, requestedCents int64, customerID string) Alert {
	return Alert{
		Kind:  KindSpendCap,
		Title: "Spend cap reached for " + period,
		Text: fmt.Sprintf("A charge of %s for customer %s was *not made*: it would pass the cap. "+
			"The event is dead-lettered with reason `spend_cap`; raise the cap (`"+cmdname.Consumer+" cap set`), then `"+cmdname.Consumer+" replay --reason spend_cap`.",
			Money(requestedCents, ""), code(customerID)),
		Fields: []Field{
			{Label: "Period", Value: period},
			{Label: "Cap", Value: Money(capCents, "")},
			{Label: "Reserved", Value: Money(reservedCents, "")},
			{Label: "Requested", Value: Money(requestedCents, "")},
		},
		Fingerprint: fmt.Sprintf("spend_cap:%s:%d", period, capCents),
	}
}

// ReaperAnomaly reports something the reaper will not fix by itself: an
// entry past the maximum deliveries, a consumer whose PEL keeps growing.
// entryID may be empty when the anomaly is about a consumer.
func ReaperAnomaly(kind string, stream, group, consumer, entryID string, detail string) Alert {
	fields := []Field{
		{Label: "Stream", Value: stream},
		{Label: "Group", Value: group},
	}
	if consumer != "" {
		fields = append(fields, Field{Label: "Consumer", Value: consumer})
	}
	if entryID != "" {
		fields = append(fields, Field{Label: "Entry", Value: entryID})
	}
	return Alert{
		Kind:        KindReaperAnomaly,
		Title:       "Reaper: " + kind,
		Text:        Escape(detail),
		Fields:      fields,
		Fingerprint: strings.Join([]string{"reaper", kind, stream, group, consumer, entryID}, "\x00"),
	}
}

// ChargeFailed reports a charge that ended failed (a permanent error): the
// customer was not billed for the period.
func ChargeFailed(customerID, period, reason string) Alert {
	return Alert{
		Kind:        KindChargeFailed,
		Title:       "Charge failed",
		Text:        fmt.Sprintf("Customer %s was *not billed* for %s: %s", code(customerID), code(period), Escape(reason)),
		Fingerprint: "charge_failed:" + customerID + "\x00" + period,
	}
}

// Decline is what ChargeDeclined reports.
type Decline struct {
	CustomerID, Period string
	// Code is Stripe's decline_code (a card) or failure code (a bank debit).
	Code string
	// Hard: no retry can succeed (lost, stolen, closed account, …); else
	// the last scheduled retry of a soft decline failed too.
	Hard    bool
	Debit   bool // a bank debit that failed after days in motion
	Attempt int  // the attempt that failed
}

// ChargeDeclined reports a charge that is final without money: a hard
// decline (one alert, never retried) or the last retry of a soft one.
func ChargeDeclined(d Decline) Alert {
	what, why := "card", "the issuer declined it"
	if d.Debit {
		what, why = "bank debit", "the bank returned it"
	}
	next := "the last scheduled retry failed too: no more retries"
	if d.Hard {
		next = "a retry of the same payment method cannot succeed, so none is made"
	}
	return Alert{
		Kind:  KindChargeDeclined,
		Title: "Charge declined: customer not billed",
		Text: fmt.Sprintf("Customer %s was *not billed* for %s: %s (%s, attempt %d); %s. "+
			"Ask the customer for another payment method; once it is set, `"+cmdname.Consumer+" retry --customer %s --period %s` charges again under a new key.",
			code(d.CustomerID), code(d.Period), why, code(cmp.Or(d.Code, "no code")), d.Attempt, next,
			Escape(d.CustomerID), Escape(d.Period)),
		Fields:      []Field{{Label: "Payment", Value: what}, {Label: "Code", Value: cmp.Or(d.Code, "none")}},
		Fingerprint: "charge_declined:" + d.CustomerID + "\x00" + d.Period,
	}
}

// ActionRequired reports a charge Stripe cannot make without the customer:
// need says what (authenticate the payment, add a payment method).
func ActionRequired(customerID, period, need string) Alert {
	return Alert{
		Kind:  KindActionRequired,
		Title: "Charge needs the customer",
		Text: fmt.Sprintf("Customer %s was *not billed* for %s: Stripe needs the customer first: %s\n"+
			"Once the customer has done it, replay the event (`"+cmdname.Consumer+" replay --reason action_required`) "+
			"or `"+cmdname.Consumer+" retry --customer %s --period %s`: it charges again under the next attempt's key.",
			code(customerID), code(period), Escape(need), Escape(customerID), Escape(period)),
		Fingerprint: "action_required:" + customerID + "\x00" + period,
	}
}

// StripeLookupFailed reports a takeover past the idempotency window whose
// Stripe lookup failed: the row stays pending rather than guessing.
func StripeLookupFailed(customerID, period string, err string) Alert {
	return Alert{
		Kind:  KindStripeLookupFailed,
		Title: "Stripe lookup failed: charge left pending",
		Text: fmt.Sprintf("Could not tell whether customer %s was already charged for %s, so nothing was charged "+
			"and the ledger row stays `pending`.\nError: %s", code(customerID), code(period), Escape(err)),
		Fingerprint: "stripe_lookup_failed:" + customerID + "\x00" + period,
	}
}

// PermissionDenied reports a restricted Stripe key that lacks a permission
// pelguard needs; detail is Stripe's 403 message, which names the permission
// ("Having the 'rak_charge_write' permission would allow this request to
// continue"). Repeats for the same permission are deduplicated, so a key
// missing a permission yields one alert per dedupe interval, not one per
// event.
func PermissionDenied(detail string) Alert {
	perm := MissingPermission(detail)
	fields := []Field(nil)
	fp := "permission_denied:" + detail
	if perm != "" {
		fields = []Field{{Label: "Missing permission", Value: perm}}
		fp = "permission_denied:" + perm
	}
	return Alert{
		Kind:  KindPermissionDenied,
		Title: "Stripe key lacks a permission",
		Text: Escape(detail) + "\nGrant the permission on the restricted key in the Stripe dashboard " +
			"(Developers → API keys → the key → Edit), or replace a revoked or mistyped key; calls that need it fail until then. " +
			"Events refused meanwhile are in the dead-letter stream with reason " +
			"`stripe_key_error`: once the key is fixed, `" + cmdname.Consumer + " replay --reason stripe_key_error`.",
		Fields:      fields,
		Fingerprint: fp,
	}
}

// StripeKeyRejected reports a Stripe API error about the key itself, with
// the title its status deserves: a 401 (stripeapi.ErrAuthentication) is a
// key that is invalid, revoked or expired, and every call fails until it
// is replaced; a 403 (stripeapi.ErrPermission) is a restricted key that
// lacks one permission (PermissionDenied). Callers branch no further: pass
// the error as the adapter returned it.
func StripeKeyRejected(err error) Alert {
	if err == nil || !errors.Is(err, stripeapi.ErrAuthentication) {
		detail := ""
		if err != nil {
			detail = err.Error()
		}
		return PermissionDenied(detail)
	}
	return Alert{
		Kind:  KindPermissionDenied,
		Title: "Stripe key invalid or revoked",
		Text: Escape(err.Error()) + "\nStripe refused the API key itself (401): it is mistyped, revoked, expired or " +
			"of the wrong account or mode. Every Stripe call fails until STRIPE_API_KEY holds a valid secret " +
			"or restricted key (sk_live_…, rk_live_…; sk_test_… or rk_test_… in test mode): roll or copy it in the Stripe " +
			"dashboard (Developers → API keys) and restart. Events refused meanwhile are in the dead-letter stream with " +
			"reason `stripe_key_error`: once the key is fixed, `" + cmdname.Consumer + " replay --reason stripe_key_error`.",
		// One alert per dedupe interval for the key, whatever the
		// request ids in the message.
		Fingerprint: "stripe_key_invalid",
	}
}

// rakPermission matches the permission Stripe names in a 403 message.
var rakPermission = regexp.MustCompile(`\brak_[a-z_]+\b`)

// MissingPermission returns the restricted-key permission a Stripe 403
// message names (e.g. "rak_payment_intent_write"), or "".
func MissingPermission(msg string) string {
	return rakPermission.FindString(msg)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "_unset_"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// UnregisteredConsumers reports group members that never registered as
// pelguard consumers and own pending entries: the reaper leaves those
// entries alone until told the consumers are stopped.
func UnregisteredConsumers(stream, group string, names []string, entries int) Alert {
	return Alert{
		Kind:  KindReaperAnomaly,
		Title: "Pending entries of consumers pelguard does not know",
		Text: fmt.Sprintf("%d pending entries on %s/%s belong to consumers that never registered as pelguard consumers: %s. "+
			"A consumer without a heartbeat looks the same dead as inside a slow Stripe call, so the reaper leaves them alone. "+
			"Once they are stopped, restart the reaper with `--stopped-consumers %s`, or run `"+cmdname.Consumer+" import` for their billing periods.",
			entries, Escape(stream), Escape(group), Escape(strings.Join(names, ", ")), Escape(strings.Join(names, ","))),
		Fingerprint: "unregistered_consumers:" + stream + "/" + group + ":" + strings.Join(names, ","),
	}
}

// StreamPaused tells the team that an operator paused (paused) or resumed
// billing from a stream: one alert per change, from whoever made it.
func StreamPaused(stream, group string, paused bool, by, reason string) Alert {
	title, text := "Billing paused on "+stream, fmt.Sprintf("%s paused billing from %s (group %s): no consumer or re-drive of it calls Stripe until "+
		"`pelguard-consumer resume --stream %s --group %s --reason ...`. Events wait pending; past 23 h, one of unknown outcome is parked on resume; past 35 days, usage can no longer be sent.",
		by, code(stream), code(group), stream, group)
	if !paused {
		title, text = "Billing resumed on "+stream, fmt.Sprintf("%s resumed billing from %s (group %s).", by, code(stream), code(group))
	}
	return Alert{Kind: KindStreamPaused, Title: title, Text: text,
		Fields:      []Field{{Label: "By", Value: by}, {Label: "Reason", Value: reason}},
		Fingerprint: fmt.Sprintf("stream_paused:%s:%s:%t", stream, group, paused)}
}
