"""Runs the team's code (team_consumer.py or team_monitor.py) unmodified.

usage: python3 -u harness.py consumer|monitor

Everything here happens around the article's code, never inside it:

  - stripe.api_base = STRIPE_API_BASE (the emulator), and KEYBRAKE_VAULT_KEY
    defaults to STRIPE_SECRET_KEY: the emulator stands in for the spend-cap
    proxy as well as for Stripe.
  - stripe.error.Timeout, which the article's consumer catches, does not exist
    in stripe-python (5.0.0 raises APIConnectionError on a timeout). Python
    evaluates an except clause's class only when an exception reaches it, so
    without an alias every CardError or other failure inside the consumer's
    try block would become AttributeError and kill the process. The alias is
    APIConnectionError, which is what the article means by a timeout.
  - logging goes to stderr at INFO, so the article's "Charged ..." and
    "Skipped ..." lines reach the Go test's log.
  - KILL_AFTER_CHARGES=N (N > 0): right after the Nth stripe.Charge.create
    returns a charge, this process SIGKILLs itself, before the caller's INSERT
    into billing_records and before XACK: the crash window of failure mode 2.
    Declined charges raise instead of returning, and do not count.
"""

import logging
import os
import runpy
import signal
import sys

import stripe
import stripe.error

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"consumer": "team_consumer.py", "monitor": "team_monitor.py"}


def install_kill_after_charges(n):
    create = stripe.Charge.create  # bound classmethod
    made = 0

    def create_then_maybe_die(*args, **kwargs):
        nonlocal made
        charge = create(*args, **kwargs)
        made += 1
        if made == n:
            print(
                f"harness: SIGKILL after charge {made} ({charge['id']}), before the INSERT",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return charge

    stripe.Charge.create = staticmethod(create_then_maybe_die)


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SCRIPTS:
        sys.exit("usage: harness.py consumer|monitor")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # stripe-python logs every request at INFO; the team's own lines suffice.
    logging.getLogger("stripe").setLevel(logging.WARNING)

    stripe.api_base = os.environ["STRIPE_API_BASE"]
    os.environ.setdefault("KEYBRAKE_VAULT_KEY", os.environ["STRIPE_SECRET_KEY"])
    if not hasattr(stripe.error, "Timeout"):
        stripe.error.Timeout = stripe.error.APIConnectionError

    n = int(os.environ.get("KILL_AFTER_CHARGES") or "0")
    if n > 0:
        install_kill_after_charges(n)

    sys.path.insert(0, HERE)  # team scripts import billing.py
    runpy.run_path(os.path.join(HERE, SCRIPTS[sys.argv[1]]), run_name="__main__")


if __name__ == "__main__":
    main()
