package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/stripeapi"
)

// alert sends the run's summary with its new findings only: a finding is
// announced once, however many runs see it again.
func (a *Auditor) alert(ctx context.Context, rep Report) {
	if a.cfg.Notifier == nil || rep.NewFindings == 0 {
		return
	}
	in := alerts.AuditSummaryInput{RunID: rep.RunID, From: rep.From, To: rep.To,
		NewFindingsByKind: map[string]int{}, DuplicateByCurrency: map[string]int64{}}
	newDups := 0
	for _, f := range rep.Findings {
		if !f.New {
			continue
		}
		in.NewFindingsByKind[string(f.Kind)]++
		if f.Kind == KindDuplicate {
			newDups++
			in.DuplicateCents += f.AmountCents
			in.DuplicateByCurrency[f.Currency] += f.AmountCents
		}
		ids := []string{}
		if f.ChargeID != "" {
			ids = append(ids, f.ChargeID)
		}
		if f.CanonicalChargeID != "" {
			ids = append(ids, f.CanonicalChargeID)
		}
		in.Findings = append(in.Findings, alerts.FindingInfo{ID: f.ID, Kind: string(f.Kind), CustomerID: cmpStr(f.CustomerID, f.StripeCustomerID),
			Period: f.BillingPeriod, ChargeIDs: ids, AmountCents: f.AmountCents, Currency: f.Currency})
	}
	if newDups > 0 {
		cmd, err := a.refundCommand(ctx)
		if err != nil {
			a.log.Warn("building the refund command for the alert", slog.Any("error", err))
		}
		in.RefundCommand = cmd
	}
	a.cfg.Notifier.Notify(alerts.AuditSummary(in))
}

// refundCommand is the exact command that refunds every open duplicate,
// with caps that fit them (and no more), so pasting it cannot refund
// something nobody has seen.
func (a *Auditor) refundCommand(ctx context.Context) (string, error) {
	open, err := a.store.openDuplicates(ctx)
	if err != nil {
		return "", err
	}
	if len(open) == 1 {
		return fmt.Sprintf("%s refund %d", a.cfg.CommandName, open[0].ID), nil
	}
	var cents int64
	for _, f := range open {
		cents += f.AmountCents
	}
	return fmt.Sprintf("%s refund --all --max-refunds %d --max-cents %d", a.cfg.CommandName, len(open), cents), nil
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// alertKey tells a human when a run or a refund failed because the Stripe
// key lacks a permission (403, the message names it) or was rejected (401):
// retrying cannot help until the key is fixed.
func (a *Auditor) alertKey(err error) {
	if a.cfg.Notifier == nil || err == nil {
		return
	}
	if errors.Is(err, stripeapi.ErrPermission) || errors.Is(err, stripeapi.ErrAuthentication) {
		a.cfg.Notifier.Notify(alerts.StripeKeyRejected(err))
	}
}
