package reaper

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/event"
	"github.com/pelguard/pelguard/internal/meterledger"
)

// The meter-event decision table, row by row.
func TestDecideMeterEntry(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ev := event.MeterEvent{EventName: "api_requests", StripeCustomerID: "cus_1", Value: 3, Timestamp: now.Add(-time.Hour), EventID: "e1"}
	row := func(status meterledger.Status, owner string, expires time.Time) meterledger.Record {
		return meterledger.Record{EventName: ev.EventName, StripeCustomerID: ev.StripeCustomerID, Value: ev.Value,
			Status: status, LeaseOwner: owner, LeaseExpiresAt: expires}
	}
	other := row(meterledger.StatusDelivered, "", time.Time{})
	other.Value = 4
	base := meterInput{Pending: redis.XPendingExt{ID: "1-0", Consumer: "dead", RetryCount: 50}, Event: ev, Identifier: "pg_x", Now: now}
	with := func(f func(*meterInput)) meterInput { in := base; f(&in); return in }
	for _, tc := range []struct {
		name string
		in   meterInput
		want Kind
	}{
		{"in flight here", with(func(in *meterInput) { in.InFlight = true }), KindInFlight},
		{"body gone", with(func(in *meterInput) { in.Gone = true }), KindGone},
		{"invalid", with(func(in *meterInput) { in.Invalid = &event.RejectError{Reason: event.ReasonBadFieldType} }), KindInvalid},
		{"delivered", with(func(in *meterInput) { in.Row, in.HasRow = row(meterledger.StatusDelivered, "", time.Time{}), true }), KindAlreadyBilled},
		{"refused", with(func(in *meterInput) { in.Row, in.HasRow = row(meterledger.StatusFailed, "", time.Time{}), true }), KindAlreadyBilled},
		{"refused after an attempt of unknown outcome", with(func(in *meterInput) {
			in.Row, in.HasRow = row(meterledger.StatusFailed, "", time.Time{}), true
			in.Row.OutcomeUnknown = true
		}), KindClaim},
		{"settled as not counted", with(func(in *meterInput) {
			in.Row, in.HasRow = row(meterledger.StatusFailed, "", time.Time{}), true
			in.Row.SettledAt = now.Add(-time.Minute)
		}), KindClaim},
		// Parked by the usage repair while its entry was pending: re-driven
		// to be dead-lettered (the consumer's code sends nothing for it).
		{"parked", with(func(in *meterInput) { in.Row, in.HasRow = row(meterledger.StatusParked, "", time.Time{}), true }), KindClaim},
		{"another event under the identifier", with(func(in *meterInput) { in.Row, in.HasRow = other, true }), KindConflict},
		{"live lease", with(func(in *meterInput) {
			in.Row, in.HasRow = row(meterledger.StatusSending, "slow", now.Add(time.Second)), true
		}), KindLeaseLive},
		{"lapsed lease", with(func(in *meterInput) {
			in.Row, in.HasRow = row(meterledger.StatusSending, "dead", now.Add(-time.Second)), true
		}), KindClaim},
		{"replay of a refused event", with(func(in *meterInput) {
			in.Row, in.HasRow, in.Replay = row(meterledger.StatusFailed, "", time.Time{}), true, true
		}), KindClaim},
		{"replay of a delivered event", with(func(in *meterInput) {
			in.Row, in.HasRow, in.Replay = row(meterledger.StatusDelivered, "", time.Time{}), true, true
		}), KindAlreadyBilled},
		// No row: the consumer died before reserving. Many deliveries are no
		// reason to stop (a live consumer re-reads busy entries).
		{"no row, many deliveries", base, KindClaim},
	} {
		if got := decideMeterEntry(tc.in); got.Kind != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got.Kind, got.Reason, tc.want)
		}
	}
}
