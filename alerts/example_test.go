package alerts_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/pelguard/pelguard/alerts"
)

// The auditor's use: build the notifier from flags and the environment,
// send one summary per run, drain on shutdown.
func Example() {
	n, err := alerts.FromEnv(alerts.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))})
	if err != nil {
		slog.Error("alerts config", "error", err)
		return
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	}()

	n.Notify(alerts.AuditSummary(alerts.AuditSummaryInput{
		RunID:             42,
		NewFindingsByKind: map[string]int{"duplicate_charge": 1},
		DuplicateCents:    2500,
		Findings: []alerts.FindingInfo{{ID: 1, Kind: "duplicate_charge", CustomerID: "c_42",
			Period: "2026-11", ChargeIDs: []string{"ch_1", "ch_2"}, AmountCents: 2500, Currency: "usd"}},
		RefundCommand: "auditor refund --run 42",
	}))
}

// The consumer's use: dead letters are aggregated, one message per stream
// per minute.
func ExampleNewDeadLetterAggregator() {
	n := alerts.NewLog(slog.Default())
	agg := alerts.NewDeadLetterAggregator(n, time.Minute, nil)
	agg.Add("billing", "invalid_amount", "1700000000000-0", "c_42")
	_ = agg.Stop(context.Background()) // flushes
}
