package consumercli

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/cli"
	"github.com/pelguard/pelguard/internal/meterledger"
	"github.com/pelguard/pelguard/stripeapi"
	"github.com/pelguard/pelguard/stripelimit"
)

const meterDescription = `Sends a stream's usage events to Stripe Billing Meters (POST /v1/billing/meter_events), each
counted once: every event is reserved in the meter ledger before its call and recorded there
before its XACK, under an identifier made of its business fields (the same after a reclaim, a
batch read again, a Redis rollback or a re-publish). A delivered event is never sent again; an
event whose outcome is unknown (a timeout, a crash after Stripe's reply) is sent again under the
same identifier only while Stripe still guards it (--safe-window), and parked past that with an
alert and a dead letter (reason meter_event_parked). One call per customer and meter at a time,
across every process (Stripe's concurrency rule).

Event (stream field payload): {"event_name":"api_requests","stripe_customer_id":"cus_ABC",
"value":3,"timestamp":"2026-11-30T12:00:00Z","event_id":"req-9f2c","customer_id":"c_42"};
value a whole number (negative allowed), timestamp RFC 3339 or unix seconds within Stripe's
window (35 days back, 5 minutes ahead), event_id and customer_id optional. Two events with every
field equal and no event_id are one event. Invalid events go to <stream>:dead with the reason.

With --send-from-ledger, events are recorded in the ledger and acked, then sent from it; with
--aggregate-meters too, one call carries the sum of a customer's events of one second that
arrived in one second, formed once every entry up to that second is in the ledger. A wider
--aggregate-bucket (e.g. 1m) catches up a backlog in fewer calls: a bucket's events are sent at
the bucket's start, so usage after a subscription period boundary inside the bucket is invoiced
in the earlier period. Keep 1s unless catching up a backlog.

Stripe permissions (a restricted key): Billing Meter Events Write; with --aggregate-meters also
Billing Meters Read (checked at start). Exit status: 0 stopped cleanly, 2 bad flags, 3 Redis or
Postgres unreachable after --wait-for-deps.`

// MeterOptions are the flags of `consumer meter-events`.
type MeterOptions struct {
	cli.RoleFlags
	Namespace      string
	Name           string
	Count          int64
	Block          time.Duration
	Workers        int
	Pipeline       int
	SendSlots      int
	SendFromLedger bool
	// AggregateMeters: --aggregate-meters, comma-separated event names.
	AggregateMeters string
	// AggregateBucket: --aggregate-bucket, an aggregate's width of event time.
	AggregateBucket time.Duration
	Lease           time.Duration
	SafeWindow      time.Duration

	streams   []cli.StreamGroup
	aggregate []string
}

func (o *MeterOptions) register(fs *flag.FlagSet) {
	o.RoleFlags.Register(fs, cli.ConsumerMetrics.Verb("send (one meter consumer per stream)"))
	cli.RegisterNamespace(fs, &o.Namespace, "part of every meter event's identifier: give each environment its own")
	fs.StringVar(&o.Name, "name", cli.Env("PELGUARD_CONSUMER_NAME", ""), "pinned consumer name; empty: unique per process [PELGUARD_CONSUMER_NAME]")
	fs.Int64Var(&o.Count, "count", 100, "entries per read, reserved and recorded in one transaction each")
	fs.DurationVar(&o.Block, "block", consumer.DefaultBlock, "XREADGROUP BLOCK")
	fs.IntVar(&o.Workers, "workers", 16, "Stripe calls at once per batch (one per customer and meter)")
	fs.IntVar(&o.Pipeline, "pipeline", 2, "batches in flight at once: the next batch's ledger work and calls overlap the slowest calls of the one before (1-16)")
	fs.IntVar(&o.SendSlots, "send-slots", 0, "with --send-from-ledger: customer-meters sent to at once, in rounds of up to --workers "+
		"(each waits for one call, about 100 ms: 64 slots send up to about 600 calls a second); 0: 4 × --workers")
	fs.BoolVar(&o.SendFromLedger, "send-from-ledger", false, "record each event in the ledger at ingest and ack it, and send from the ledger: "+
		"a busy customer's backlog never delays another's; fences the ledger against per-event consumers for good")
	fs.StringVar(&o.AggregateMeters, "aggregate-meters", "", "comma-separated event names of sum meters (NAME[,NAME]) whose events of one "+
		"second go to Stripe as one call carrying their sum, exact through a rollback of Redis and Postgres together; "+
		"needs --send-from-ledger; refused at start for a count or last meter")
	fs.DurationVar(&o.AggregateBucket, "aggregate-bucket", meterledger.DefaultBucket, "width of an aggregate's bucket of event time: "+
		"a bucket's events go as one call timestamped at the bucket's start; wider than 1s (any width dividing an hour: "+
		"1s,2s,5s,10s,15s,30s,1m,5m,15m,1h…) catches up a backlog in fewer calls, but usage after a subscription period "+
		"boundary inside a bucket is invoiced in the earlier period; keep 1s unless catching up a backlog")
	fs.DurationVar(&o.Lease, "lease", consumer.DefaultLease, "meter ledger lease and customer-meter slot; renewed every lease/3")
	fs.DurationVar(&o.SafeWindow, "safe-window", 23*time.Hour, "an event whose outcome is unknown is sent again only this long after its first attempt (below Stripe's 24 h)")
}

// Validate checks the flags before anything is built.
func (o *MeterOptions) Validate() error {
	if err := o.RoleFlags.CheckSchema(); err != nil {
		return err
	}
	streams, err := o.Streams.Resolve(o.Group)
	if err != nil {
		return err
	}
	o.streams = streams
	o.aggregate = splitList(o.AggregateMeters)
	switch {
	case len(o.aggregate) > 0 && !o.SendFromLedger:
		return cli.Usagef("--aggregate-meters needs --send-from-ledger (aggregates are formed from the ledger's queued events): " +
			"add --send-from-ledger to every meter consumer of the ledger, or drop --aggregate-meters")
	case o.AggregateMeters != "" && len(o.aggregate) == 0:
		return cli.Usagef("--aggregate-meters %q names no meter: give event names separated by commas", o.AggregateMeters)
	case meterledger.CheckBucket(o.AggregateBucket) != nil:
		return cli.Usagef("--aggregate-bucket %s: give a whole number of seconds that divides an hour evenly (%s), e.g. "+
			"--aggregate-bucket 1m to catch up a backlog, or leave it at 1s", o.AggregateBucket, meterledger.Buckets)
	case o.AggregateBucket != meterledger.DefaultBucket && len(o.aggregate) == 0:
		return cli.Usagef("--aggregate-bucket %s applies to aggregated meters only: add --aggregate-meters NAME[,NAME], "+
			"or drop --aggregate-bucket", o.AggregateBucket)
	case o.Count <= 0 || o.Workers <= 0:
		return cli.Usagef("--count %d and --workers %d must be positive", o.Count, o.Workers)
	case o.Pipeline < 1 || o.Pipeline > 16:
		return cli.Usagef("--pipeline %d must be between 1 and 16", o.Pipeline)
	case o.SendSlots < 0 || o.SendSlots > 1024:
		return cli.Usagef("--send-slots %d must be between 0 (4 × --workers) and 1024", o.SendSlots)
	case o.SendSlots > 0 && !o.SendFromLedger:
		return cli.Usagef("--send-slots %d applies to --send-from-ledger only: add --send-from-ledger, or drop --send-slots", o.SendSlots)
	case o.Lease < 3*time.Second:
		return cli.Usagef("--lease %s: at least 3s (it is renewed every lease/3)", o.Lease)
	case o.SafeWindow <= 0 || o.SafeWindow >= 24*time.Hour:
		return cli.Usagef("--safe-window %s must be positive and below Stripe's 24h identifier window", o.SafeWindow)
	}
	return o.RoleFlags.Validate(true)
}

func meterCmd(ctx context.Context, args []string, _, stderr io.Writer) int {
	var o MeterOptions
	fs := cli.NewFlagSet(prog, prog+" meter-events [flags]", meterDescription, stderr)
	o.register(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	if err := o.Validate(); err != nil {
		return cli.Fail(stderr, prog, err)
	}
	return o.run(ctx, stderr)
}

func (o *MeterOptions) run(ctx context.Context, stderr io.Writer) int {
	const role = "meter-events"
	conns, err := cli.MaxDBConns(o.MaxDBConns, len(o.streams)*2+4)
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	rp, err := cli.BuildRole(ctx, stderr, o.Role(role, "consumer", o.Name, true, stripelimit.RoleBilling, conns))
	if err != nil {
		return cli.Fail(stderr, prog, err)
	}
	defer rp.Close()
	// The billing consumer's dead-letter alerts, per stream and minute:
	// an event refused or malformed is seen outside Prometheus too.
	dl := alerts.NewDeadLetterAggregator(rp.Notifier, time.Minute, nil)
	defer func() { _ = dl.Stop(context.Background()) }()
	if len(o.aggregate) > 0 {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		meters, err := rp.Stripe.ListMeters(lctx)
		cancel()
		if err != nil {
			return cli.Fail(stderr, prog, fmt.Errorf("checking --aggregate-meters against the account's billing meters "+
				"(the key needs Billing Meters Read): %w", err))
		}
		if err := checkAggregateMeters(o.aggregate, meters); err != nil {
			return cli.Fail(stderr, prog, err)
		}
	}
	logger, mon, pool, rdb, pauses := rp.Logger, rp.Witness, rp.Pool, rp.Redis, rp.Pauses
	var cs []*consumer.MeterConsumer
	metrics := consumer.NewMetrics(rp.Registry)
	for _, sg := range o.streams {
		c, err := consumer.NewMeterConsumer(consumer.MeterConfig{Redis: rdb, DB: pool, Schema: o.Schema, Stripe: rp.Stripe,
			Stream: sg.Stream, Group: sg.Group, Name: o.Name, Namespace: o.Namespace, Count: o.Count, Block: o.Block,
			Workers: o.Workers, Pipeline: o.Pipeline, SendSlots: o.SendSlots, SendFromLedger: o.SendFromLedger, AggregateMeters: o.aggregate, AggregateBucket: o.AggregateBucket, Lease: o.Lease, SafeWindow: o.SafeWindow, Rules: event.MeterRules{}, Witness: mon,
			Metrics: metrics, Notifier: rp.Notifier, DeadLetters: dl, Logger: logger, Paused: pauses.Func(sg.Stream, sg.Group)})
		if err != nil {
			return cli.Fail(stderr, prog, cli.Usagef("%v", err))
		}
		cs = append(cs, c)
	}
	ops, started, code, ok := cli.Startup{Prog: prog, MetricsAddr: o.MetricsAddr, Registry: rp.Registry, Redis: rdb, Pool: pool,
		Deps: rp.Deps, Wait: o.WaitForDeps, Schema: o.Schema,
		ClockLimit: o.Lease / 3, ClockWhat: "a third of --lease", Logger: logger, Rollback: mon,
		Agreement: cli.Agreement{Namespace: o.Namespace, Streams: cli.UsageStreams(o.streams), Record: true, By: mon.Writer()}, Pauses: pauses}.Run(ctx, stderr)
	if !ok {
		return code
	}
	defer func() { _ = ops.Close(context.Background()) }()
	for _, sg := range o.streams {
		if err := consumer.EnsureGroup(ctx, rdb, sg.Stream, sg.Group); err != nil {
			return cli.Fail(stderr, prog, err)
		}
	}
	started.Open()
	logger.Info("sending meter events", "streams", len(cs), "namespace", o.Namespace)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(ctx); err != nil {
				logger.Error("meter consumer stopped", "err", err)
			}
		}()
	}
	wg.Wait()
	logger.Info("stopped cleanly")
	return cli.ExitOK
}

// splitList splits a comma-separated flag value, dropping empty names and
// repeats.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// checkAggregateMeters refuses --aggregate-meters names that are not the
// event names of sum meters of the account: Stripe counts a count meter's
// events (an aggregate would count as one) and keeps one value of a last
// meter's second (an order of a second's events the ledger cannot prove).
func checkAggregateMeters(names []string, meters []stripeapi.Meter) error {
	for _, n := range names {
		i := slices.IndexFunc(meters, func(m stripeapi.Meter) bool { return m.EventName == n })
		switch {
		case i < 0:
			return cli.Usagef("--aggregate-meters %s: the Stripe account has no billing meter with event name %s: "+
				"create it as a sum meter, or remove %s from --aggregate-meters", n, n, n)
		case meters[i].Formula != stripeapi.MeterFormulaSum:
			return cli.Usagef("--aggregate-meters %s: meter %s (%s) aggregates by %s, not sum: Stripe would count an aggregate "+
				"as one event or keep one value of its second; remove %s from --aggregate-meters (its events are sent one per call)",
				n, meters[i].ID, n, cmp.Or(meters[i].Formula, "an unknown formula"), n)
		}
	}
	return nil
}
