package consumer

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
)

// CapAlertTTL is how long the fleet remembers that a cap's alert was sent:
// the refused month (or period) and the 35 days after it in which its
// events may still arrive.
const CapAlertTTL = 62 * 24 * time.Hour

// NotifyCapOnce sends a spend_cap alert once across the fleet for its
// fingerprint (period, or meter, customer and month; and the cap) in one
// ledger (schema) and namespace: a key
// pelguard:cap-alerted:<schema>:<namespace>:<fingerprint>, set if absent,
// for CapAlertTTL. Every consumer and reaper process refusing events of a capped
// customer all month would otherwise each send it again every dedupe
// interval. A raised cap reached again is a new cap value: alerted again.
// When Redis cannot answer, the alert is sent: twice is better than never.
func NotifyCapOnce(ctx context.Context, rdb redis.UniversalClient, n alerts.Notifier, schema, namespace string, a alerts.Alert) {
	key := CapAlertKey(schema, namespace, a.Fingerprint)
	ctx, cancel := detach(ctx)
	defer cancel()
	if first, err := rdb.SetNX(ctx, key, 1, CapAlertTTL).Result(); err == nil && !first {
		return
	}
	n.Notify(a)
}

// CapAlertKey is the Redis key NotifyCapOnce sets for an alert's
// fingerprint.
func CapAlertKey(schema, namespace, fingerprint string) string {
	return "pelguard:cap-alerted:" + schema + ":" + namespace + ":" + fingerprint
}
