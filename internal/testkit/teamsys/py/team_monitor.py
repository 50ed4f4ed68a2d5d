# The team's naive "stuck message" monitor. The article describes it but
# prints no code: "a monitoring job or a second consumer in the group calls
# XAUTOCLAIM billing-stream billing-group consumer-B 60000 0-0", "a separate
# process periodically calls XAUTOCLAIM to reclaim messages stuck in the PEL
# for longer than a threshold". This is that loop written the obvious way, in
# the style of the article's consumer: every INTERVAL_MS it runs
# XAUTOCLAIM STREAM GROUP CONSUMER MIN_IDLE_MS 0-0 (following the cursor to the
# end of the PEL), passes each reclaimed entry to the article's
# process_billing_event and XACKs it.
#
# It cannot tell a dead consumer from a slow one (failure mode 1), and it
# trusts the idempotency key to make a second charge harmless, which holds
# only for 24 hours.
#
# Environment: REDIS_URL, DATABASE_URL, STREAM, GROUP, CONSUMER (default
# "monitor-consumer"), MIN_IDLE_MS (default 60000, the article's threshold),
# INTERVAL_MS between passes (default 1000), MONITOR_ONCE=1 for one pass.
# KEYBRAKE_VAULT_KEY as for the consumer (harness.py sets it).

import redis
import psycopg2
import os
import json
import time
import logging

from billing import process_billing_event

logger = logging.getLogger(__name__)

r = redis.Redis.from_url(os.environ["REDIS_URL"])
STREAM = os.environ.get("STREAM", "billing-stream")
GROUP = os.environ.get("GROUP", "billing-group")
CONSUMER = os.environ.get("CONSUMER") or "monitor-consumer"
MIN_IDLE_MS = int(os.environ.get("MIN_IDLE_MS", "60000"))
INTERVAL_MS = int(os.environ.get("INTERVAL_MS", "1000"))
ONCE = os.environ.get("MONITOR_ONCE") == "1"

conn = psycopg2.connect(os.environ["DATABASE_URL"])

while True:
    start_id = "0-0"
    while True:
        # Redis 7 replies [next-cursor, entries, deleted-ids]; 6.2 has no third element.
        reply = r.xautoclaim(STREAM, GROUP, CONSUMER, MIN_IDLE_MS, start_id)
        next_id, messages = reply[0], reply[1]

        for msg_id, fields in messages:
            try:
                event = json.loads(fields[b"payload"])
                result = process_billing_event(conn, event)
                r.xack(STREAM, GROUP, msg_id)
                logger.info(
                    "Reclaimed %s %s/%s: %s (%s)",
                    msg_id.decode(),
                    event["customer_id"],
                    event["billing_period"],
                    "already_billed" if result.get("skipped") else "charged",
                    result.get("charge_id"),
                )
            except Exception as e:
                # Leave it in the PEL (now ours); the next pass reclaims it again.
                logger.error("Reclaimed %s failed: %s — keeping in PEL", msg_id.decode(), e)

        if next_id in (b"0-0", "0-0"):
            break
        start_id = next_id

    if ONCE:
        break
    time.sleep(INTERVAL_MS / 1000)
