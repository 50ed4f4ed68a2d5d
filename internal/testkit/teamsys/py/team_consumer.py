# The article's final "Safe Redis Streams billing consumer with per-event XACK
# and write-before-ack", copied verbatim except for the lines marked
# "teamsys:" below:
#   - STREAM, GROUP and CONSUMER come from the environment (the article
#     hard-codes "billing-stream", "billing-group" and f"worker-{os.getpid()}",
#     which stay the defaults), so parallel tests get their own names;
#   - process_billing_event is imported from billing.py, the article's
#     Layer 1 snippet, which the article's consumer calls without defining.
# The article gives the main loop and XREADGROUP's parameters (COUNT 1,
# BLOCK 5000) itself; it does not create the consumer group, which the team
# creates once (XGROUP CREATE ... MKSTREAM); the Go harness does that.
#
# Run it through harness.py, which points stripe at the emulator, configures
# logging and injects faults without touching this file. The article's
# `except stripe.error.Timeout` names a class stripe-python never had (5.0.0
# raises stripe.error.APIConnectionError on a timeout); as printed, any
# exception in the try block would turn into AttributeError there and kill
# the process. harness.py aliases the name; see its docstring.

import redis
import stripe
import psycopg2
import os
import json
import logging

from billing import process_billing_event  # teamsys: the article's Layer 1 snippet

logger = logging.getLogger(__name__)

r = redis.Redis.from_url(os.environ["REDIS_URL"])
STREAM = os.environ.get("STREAM", "billing-stream")  # teamsys: from the environment
GROUP = os.environ.get("GROUP", "billing-group")  # teamsys: from the environment
CONSUMER = os.environ.get("CONSUMER") or f"worker-{os.getpid()}"  # teamsys: from the environment

conn = psycopg2.connect(os.environ["DATABASE_URL"])

while True:
    # Read ONE message at a time to minimize XAUTOCLAIM blast radius.
    # COUNT=1 ensures that if XAUTOCLAIM reclaims this PEL entry while
    # we're in stripe.charges.create(), only one billing event is affected —
    # not a batch of 10 where events 1-9 were billed and only event 10 failed.
    results = r.xreadgroup(GROUP, CONSUMER, {STREAM: ">"}, count=1, block=5000)

    if not results:
        continue

    for stream_name, messages in results:
        for msg_id, fields in messages:
            try:
                event = json.loads(fields[b"payload"])
                customer_id = event["customer_id"]
                billing_period = event["billing_period"]

                result = process_billing_event(conn, event)

                if result.get("skipped"):
                    # Pre-flight check found existing billing record.
                    # XACK removes from PEL — no further redelivery.
                    r.xack(STREAM, GROUP, msg_id)
                    logger.info(
                        "Skipped %s/%s: already_billed (%s)",
                        customer_id,
                        billing_period,
                        result.get("charge_id"),
                    )
                    continue

                # billing_records write completed inside process_billing_event.
                # XACK AFTER the database write (write-before-ack pattern).
                # If this XACK is lost to AOF data loss (appendfsync everysec),
                # the re-delivered message hits the pre-flight check above —
                # billing_records row exists (PostgreSQL survived the Redis failover)
                # and the Stripe call is skipped.
                r.xack(STREAM, GROUP, msg_id)
                logger.info(
                    "Charged %s/%s: %s",
                    customer_id,
                    billing_period,
                    result.get("charge_id"),
                )

            except stripe.error.Timeout:
                # Stripe timed out. ch_A may already exist on Stripe's servers.
                # Do NOT call XACK — keep the message in PEL for redelivery.
                # On redelivery (XAUTOCLAIM or GROUP re-read from PEL):
                # - content-hash idempotency key returns ch_A within 24h
                # - pre-flight check skips if billing_records was written before timeout
                # Do NOT XACK after a Stripe timeout. Let XAUTOCLAIM handle redelivery.
                logger.warning(
                    "Stripe timeout for %s/%s — keeping in PEL for redelivery",
                    event.get("customer_id"),
                    event.get("billing_period"),
                )

            except stripe.error.CardError as e:
                # Card declined — permanent failure. Write to billing_records
                # with status='card_declined', then XACK to remove from PEL.
                # Do NOT leave in PEL: XAUTOCLAIM would re-deliver indefinitely,
                # creating repeated Stripe card-decline events visible to the customer.
                try:
                    with conn.cursor() as cur:
                        cur.execute(
                            """
                            INSERT INTO billing_records
                                (customer_id, billing_period, charge_id,
                                 amount_cents, status, error, created_at)
                            VALUES (%s, %s, NULL, %s, 'card_declined', %s, NOW())
                            ON CONFLICT (customer_id, billing_period) DO NOTHING
                            """,
                            (
                                event["customer_id"],
                                event["billing_period"],
                                event["amount_cents"],
                                str(e),
                            ),
                        )
                        conn.commit()
                finally:
                    r.xack(STREAM, GROUP, msg_id)

            except Exception as e:
                logger.error(
                    "Billing failed for %s: %s — keeping in PEL",
                    event.get("customer_id"),
                    e,
                )
                # For unknown errors, keep in PEL for XAUTOCLAIM redelivery.
                # The idempotency key and pre-flight check make the next
                # delivery safe regardless of what the current delivery did.
