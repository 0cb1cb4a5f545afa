"""A small billing service that publishes `invoice.paid` in the same transaction as the payment.

The webhook cannot get ahead of the data, and the data cannot get ahead of the webhook: the invoice's new
status and the event commit together or not at all (see docs/outbox.md).

    python billing.py --database postgres://shop@db/shop init
    python billing.py --database postgres://shop@db/shop pay inv_42 --amount 1200
    python billing.py --database postgres://shop@db/shop pay inv_43 --decline   # rolled back: no event

Two ways to publish, chosen with --outbox:
  herald  the service shares Herald's PostgreSQL: SELECT herald_publish(...) (the default)
  table   the service has its own database: INSERT INTO herald_outbox (...), published by `herald relay`
"""

import argparse
import json
import sys

import psycopg


class CardDeclined(Exception):
    """The payment provider refused the card after the invoice was updated: the transaction must undo it."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS invoice (
    id       TEXT PRIMARY KEY,
    customer TEXT NOT NULL,
    amount   BIGINT NOT NULL,
    status   TEXT NOT NULL DEFAULT 'open',
    paid_at  TIMESTAMPTZ
)
"""


def init(conn, invoices):
    """Create the invoice table and a few open invoices."""
    with conn.transaction():
        conn.execute(SCHEMA)
        for invoice_id, customer, amount in invoices:
            conn.execute(
                "INSERT INTO invoice (id, customer, amount) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (invoice_id, customer, amount),
            )


def publish(conn, outbox, app, event_type, payload, event_id, ordering_key):
    """Write the event in the caller's transaction, one way or the other."""
    if outbox == "herald":
        conn.execute(
            "SELECT herald_publish(%s, %s, %s::jsonb, %s, NULL, %s)",
            (app, event_type, json.dumps(payload), event_id, ordering_key),
        )
    else:
        conn.execute(
            "INSERT INTO herald_outbox (event_id, app, event_type, payload, ordering_key) "
            "VALUES (%s, %s, %s, %s::jsonb, %s)",
            (event_id, app, event_type, json.dumps(payload), ordering_key),
        )


def pay_invoice(conn, invoice_id, app, outbox="herald", decline=False):
    """Mark an invoice paid and publish `invoice.paid`, atomically. Returns the event id.

    The event id names the event (`invoice.paid:<invoice>`), so a retried payment publishes nothing new:
    Herald keeps one message per event id.
    """
    with conn.transaction():
        row = conn.execute(
            "UPDATE invoice SET status = 'paid', paid_at = now() WHERE id = %s AND status = 'open' "
            "RETURNING customer, amount, paid_at",
            (invoice_id,),
        ).fetchone()
        if row is None:
            raise LookupError(f"invoice {invoice_id} is not open")
        customer, amount, paid_at = row
        event_id = f"invoice.paid:{invoice_id}"
        payload = {
            "type": "invoice.paid",
            "invoice": invoice_id,
            "customer": customer,
            "amount": amount,
            "paidAt": paid_at.isoformat(),
        }
        publish(conn, outbox, app, "invoice.paid", payload, event_id, invoice_id)
        if decline:
            # Anything failing after the writes (here: the card) rolls back the update *and* the event.
            raise CardDeclined(f"card declined for {invoice_id}")
    return event_id


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", required=True, help="PostgreSQL URL of the service's database")
    parser.add_argument("--app", default="acme", help="Herald application id or uid")
    parser.add_argument("--outbox", choices=["herald", "table"], default="herald")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init", help="create the invoice table and invoices inv_1 … inv_5")
    pay = commands.add_parser("pay", help="pay an invoice and publish invoice.paid")
    pay.add_argument("invoice")
    pay.add_argument("--decline", action="store_true", help="fail after the update (the transaction rolls back)")
    args = parser.parse_args(argv)

    with psycopg.connect(args.database) as conn:
        if args.command == "init":
            init(conn, [(f"inv_{n}", f"cus_{n}", 100 * n) for n in range(1, 6)])
            print("initialised")
            return 0
        try:
            event_id = pay_invoice(conn, args.invoice, args.app, args.outbox, args.decline)
        except (CardDeclined, LookupError) as error:
            print(f"not paid: {error}", file=sys.stderr)
            return 1
        print(f"paid {args.invoice}; published {event_id}")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
