package alerts

import (
	"fmt"
	"strconv"
	"time"
)

// LedgerRollback reports a ledger that went back in time: commits the
// writers saw committed are gone (a failover to an asynchronous replica, a
// restore). Sent once per rollback, by the process that recorded it.
func LedgerRollback(id int64, evidence string, lostSince time.Time, fenced int64) Alert {
	return Alert{
		Kind:  KindLedgerRollback,
		Title: "The ledger went back in time: commits were lost",
		Text: "Postgres no longer has ledger commits that pelguard's processes saw committed (a failover to an " +
			"asynchronous replica, or a restore). Every holder from before it is fenced out, every charge asks " +
			"Stripe first until the repair from Stripe finishes, and the fleet repairs the ledger by itself.\n" +
			"What was lost: " + Escape(evidence),
		Fields: []Field{
			{Label: "Rollback", Value: strconv.FormatInt(id, 10)},
			{Label: "Repair reads Stripe from", Value: fmtTime(lostSince)},
			{Label: "Rows fenced", Value: strconv.FormatInt(fenced, 10)},
		},
		Fingerprint: "ledger_rollback:" + strconv.FormatInt(id, 10),
	}
}

// LedgerRepaired reports the end of a rollback's repair: what was rebuilt
// from Stripe, and how long detection-to-repair took.
func LedgerRepaired(id int64, rebuilt, repaired, refunds, findings int, took time.Duration, notes string) Alert {
	text := fmt.Sprintf("Rebuilt %d lost rows and brought %d rows taken back to pending or processing in line with "+
		"Stripe; %d refunds back in the rolling refund cap. Billing no longer asks Stripe before every charge.",
		rebuilt, repaired, refunds)
	if findings > 0 {
		text += fmt.Sprintf("\n%d findings need a person: see the console's ledger page.", findings)
	}
	if notes != "" {
		text += "\n" + Escape(notes)
	}
	return Alert{
		Kind:  KindLedgerRepaired,
		Title: "The ledger is repaired from Stripe",
		Text:  text,
		Fields: []Field{
			{Label: "Rollback", Value: strconv.FormatInt(id, 10)},
			{Label: "Detected to repaired", Value: took.Round(time.Second).String()},
		},
		Fingerprint: "ledger_repaired:" + strconv.FormatInt(id, 10),
	}
}
