package audit

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pelguard/pelguard/stripeapi"
)

// entry is what grouping needs of one succeeded charge, and nothing more:
// the row of audit_stage a listed charge becomes, and what one group is
// read back as (legacy charges are held as these for the whole run).
type entry struct {
	id             string
	created        int64
	amount         int64
	refunded       int64
	currency       string
	stripeCustomer string
	idemKey        string
	// intent is the charge's PaymentIntent id: a ledger row may record the
	// intent rather than the charge.
	intent string
	// disputed is Stripe's charge.disputed.
	disputed bool
}

// net is what the charge still holds: a fully refunded charge is not a
// duplicate, a partly refunded one still is (for the remainder).
func (e entry) net() int64 { return e.amount - e.refunded }

func byCreated(a, b entry) int {
	return cmp.Or(cmp.Compare(a.created, b.created), cmp.Compare(a.id, b.id))
}

// groupKey is (ledger customer id, period) for pelguard charges (marked,
// or recorded in the ledger) and (Stripe customer id, period) for legacy
// ones.
type groupKey struct{ customer, period string }

// collector receives the listing's charges from every sub-window and
// files each page: pelguard charges go to the run's stage (see stage.go),
// legacy ones (--legacy) stay here.
type collector struct {
	runID    int64
	period   string
	legacyRE *regexp.Regexp // nil unless --legacy

	mu     sync.Mutex
	legacy map[groupKey][]entry
	// review, when set, is told of the charges open findings name.
	review *reviewer

	// strs interns the strings that repeat across legacy charges (periods,
	// currencies), so they do not hold a copy of "usd" each.
	strs map[string]string

	scanned, pelguardN, legacyN atomic.Int64
}

func (c *collector) intern(s string) string {
	if v, ok := c.strs[s]; ok {
		return v
	}
	if len(c.strs) < 10_000 {
		c.strs[s] = s
	}
	return s
}

func newCollector(runID int64, period string, legacyRE *regexp.Regexp) *collector {
	return &collector{runID: runID, period: period, legacyRE: legacyRE, legacy: map[groupKey][]entry{}, strs: map[string]string{}}
}

// add files one page of charges under the collector's lock (one lock per
// page rather than per charge keeps parallel listers from contending) and
// returns the page's rows for the stage. known holds the ledger rows of the
// page's unmarked charges (see file). Every succeeded charge is staged,
// those that no pelguard group takes as stageSeen: any of them may be the
// charge a ledger row of the window records.
func (c *collector) add(page []stripeapi.Charge, known recorded) []stageRow {
	c.mu.Lock()
	defer c.mu.Unlock()
	rows := make([]stageRow, 0, len(page))
	for i := range page {
		ch := &page[i]
		c.review.note(ch.ID, fact{status: ch.Status, net: ch.AmountCents - ch.AmountRefundedCents,
			disputed: ch.Disputed, intent: ch.PaymentIntentID})
		e := entry{id: ch.ID, created: ch.Created.Unix(), amount: ch.AmountCents, refunded: ch.AmountRefundedCents,
			currency: ch.Currency, stripeCustomer: ch.StripeCustomerID, intent: ch.PaymentIntentID,
			disputed: ch.Disputed}
		switch ch.Status {
		case "succeeded":
		case "pending":
			// Money in motion: judged once final (pending.go). Only a
			// charge that may be pelguard's, or with --legacy an old
			// consumer's, is worth following.
			if _, recorded := known.of(ch); recorded || stripeapi.IsPelguard(ch.Metadata) || c.legacyRE != nil {
				rows = append(rows, stageRow{grp: stagePending, e: e})
			}
			continue
		default:
			rows = append(rows, stageRow{grp: stageFailed, e: e})
			continue
		}
		md := ch.Metadata
		if stripeapi.IsPelguard(md) {
			c.pelguardN.Add(1)
			k := groupKey{md[stripeapi.MetaCustomerID], md[stripeapi.MetaBillingPeriod]}
			if c.period != "" && k.period != c.period {
				rows = append(rows, stageRow{grp: stageSeen, e: e})
				continue
			}
			e.idemKey = md[stripeapi.MetaIdempotencyKey]
			if k.customer == "" || k.period == "" {
				rows = append(rows, stageRow{grp: stageUnkeyed, e: e})
				continue
			}
			rows = append(rows, stageRow{grp: stagePelguard, k: k, e: e})
			continue
		}
		rows = append(rows, c.addUnmarked(ch, e, known))
	}
	return rows
}

// subWindows splits [from, to) into n contiguous parts on whole seconds
// (Stripe's created filter has one-second resolution, so parts that share
// a boundary second would list its charges twice or not at all).
func subWindows(from, to time.Time, n int) [][2]time.Time {
	lo, hi := from.Unix(), to.Unix()
	if to.Nanosecond() > 0 {
		hi++
	}
	if from.Nanosecond() > 0 {
		lo++
	}
	span := hi - lo
	if span <= 0 {
		return nil
	}
	n = int(min(int64(n), span))
	out := make([][2]time.Time, 0, n)
	for i := range n {
		a := lo + span*int64(i)/int64(n)
		b := lo + span*int64(i+1)/int64(n)
		out = append(out, [2]time.Time{time.Unix(a, 0).UTC(), time.Unix(b, 0).UTC()})
	}
	return out
}

// list streams every charge created in [from, to) into c, Parallel
// sub-windows at a time.
func (a *Auditor) list(ctx context.Context, from, to time.Time, c *collector) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, w := range subWindows(from, to, a.cfg.Parallel) {
		g.Go(func() error {
			page := make([]stripeapi.Charge, 0, 100)
			err := a.stripe.ListCharges(ctx, w[0], w[1], func(ch stripeapi.Charge) error {
				// Keep the slice but drop the metadata map and description
				// references as soon as the page is filed.
				page = append(page, ch)
				if len(page) == cap(page) {
					if err := a.file(ctx, c, page); err != nil {
						return err
					}
					clear(page)
					page = page[:0]
				}
				return nil
			})
			if err != nil {
				return err
			}
			return a.file(ctx, c, page)
		})
	}
	return g.Wait()
}

// countingTransport counts list pages for the progress line and the report.
type countingTransport struct {
	next  http.RoundTripper
	pages *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/charges" {
		t.pages.Add(1)
	}
	return t.next.RoundTrip(r)
}

func countingClient(base *http.Client, pages *atomic.Int64) *http.Client {
	var hc http.Client
	var rt http.RoundTripper
	if base != nil {
		hc = *base
		rt = base.Transport
	}
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// Parallel listers talk to one host; the default of 2 idle
		// connections per host would reconnect for most pages.
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 128, 128
		rt = t
	}
	hc.Transport = countingTransport{next: rt, pages: pages}
	return &hc
}

// verifyMissing lists [from, to) once more for charges the ledger recorded
// long after they were created (a takeover past the 24 h key window records
// the charge it found at Stripe), and stages the succeeded ones as seen.
func (a *Auditor) verifyMissing(ctx context.Context, runID int64, from, to time.Time) error {
	if !from.Before(to) {
		return nil
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, w := range subWindows(from, to, a.cfg.Parallel) {
		g.Go(func() error {
			rows := make([]stageRow, 0, 100)
			err := a.stripe.ListCharges(ctx, w[0], w[1], func(ch stripeapi.Charge) error {
				if ch.Status == "succeeded" {
					rows = append(rows, stageRow{grp: stageSeen, e: entry{id: ch.ID, intent: ch.PaymentIntentID,
						created: ch.Created.Unix(), amount: ch.AmountCents}})
				}
				if len(rows) == cap(rows) {
					if err := a.stageRows(ctx, runID, rows); err != nil {
						return err
					}
					rows = rows[:0]
				}
				return nil
			})
			if err != nil {
				return err
			}
			return a.stageRows(ctx, runID, rows)
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("verifying missing charges: %w", err)
	}
	return nil
}

// sortedGroup returns the group's billable charges, oldest first.
func billable(es []entry) []entry {
	out := make([]entry, 0, len(es))
	for _, e := range es {
		if e.net() > 0 {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, byCreated)
	return out
}
