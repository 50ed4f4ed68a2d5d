# The article's "Layer 1: content-hash idempotency key stable across XAUTOCLAIM
# redeliveries and AOF replay", copied verbatim: make_idempotency_key and
# process_billing_event, imports included. The article prints it as its own
# snippet and its final consumer calls process_billing_event without defining
# it, so it lives here as the module both team_consumer.py and team_monitor.py
# import. Do not edit: pelguard's tests must run the team's code, not ours.
#
# Notes for readers (outside the article's text):
#   - currency is hard-coded "usd"; the event's currency field is ignored.
#   - the charge carries no metadata: only customer, description and the
#     Idempotency-Key header tie it to (customer_id, billing_period).
#   - KEYBRAKE_VAULT_KEY is the spend-cap proxy's Stripe key; harness.py sets
#     it to STRIPE_SECRET_KEY, since the emulator stands in for both.

import hashlib
import stripe
import os
import json
import psycopg2

def make_idempotency_key(customer_id: str, billing_period: str) -> str:
    # Derived from stable business identity: customer + billing period only.
    # Must NOT include: Redis message ID (millisecondTimestamp-sequenceNumber
    # assigned at XADD; a re-added message gets a new ID), delivery count
    # from XPENDING (increments on each XAUTOCLAIM transfer), consumer name
    # from the PEL (changes on every XAUTOCLAIM reclaim), or stream name
    # (changes if the billing event is moved to a different stream).
    # All of these change across XAUTOCLAIM redeliveries and AOF replay.
    raw = f"{customer_id}:{billing_period}:redis-streams-billing"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def process_billing_event(conn, event: dict) -> dict:
    customer_id = event["customer_id"]
    stripe_customer_id = event["stripe_customer_id"]
    amount_cents = event["amount_cents"]
    billing_period = event["billing_period"]

    idempotency_key = make_idempotency_key(customer_id, billing_period)

    # Pre-flight check: was this customer already billed for this period?
    # Authoritative source: billing_records (PostgreSQL — durable through Redis failover).
    # This closes all three Redis Streams failure modes:
    # (1) XAUTOCLAIM: if the first consumer wrote billing_records before the
    #     XAUTOCLAIM reclaim, the second consumer's pre-flight check skips the Stripe call.
    # (2) Batch partial failure: if billing_records was written for customers 1-6,
    #     the XAUTOCLAIM consumer's pre-flight check finds existing rows and skips those 6.
    # (3) AOF data loss: billing_records is in PostgreSQL (survives Redis failover).
    #     The consumer that re-receives the AOF-restored message finds the row and skips.
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT charge_id, status FROM billing_records
            WHERE customer_id = %s AND billing_period = %s
            """,
            (customer_id, billing_period),
        )
        existing = cur.fetchone()

    if existing:
        return {
            "skipped": True,
            "reason": "already_billed",
            "charge_id": existing[0],
        }

    vault_key = os.environ["KEYBRAKE_VAULT_KEY"]  # per-billing-period key with spend cap

    charge = stripe.Charge.create(
        amount=amount_cents,
        currency="usd",
        customer=stripe_customer_id,
        description=f"Usage billing for {billing_period}",
        idempotency_key=idempotency_key,
        api_key=vault_key,   # proxied through spend-cap layer
    )

    # Write to billing_records BEFORE calling XACK.
    # Write-before-ack: if XACK is lost (AOF data loss) and the message is
    # re-delivered, the next consumer's pre-flight check finds this row.
    # ON CONFLICT DO NOTHING closes the XAUTOCLAIM race:
    # if two consumers simultaneously passed the pre-flight check (XAUTOCLAIM
    # fired just after both consumers read no existing row), the unique constraint
    # ensures only one INSERT succeeds — the second is silently ignored.
    # The idempotency key ensures both consumers receive ch_A from Stripe.
    with conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO billing_records
                (customer_id, billing_period, charge_id, amount_cents, status, created_at)
            VALUES (%s, %s, %s, %s, 'charged', NOW())
            ON CONFLICT (customer_id, billing_period) DO NOTHING
            """,
            (customer_id, billing_period, charge["id"], amount_cents),
        )
    conn.commit()

    return {"charge_id": charge["id"], "status": "charged"}
