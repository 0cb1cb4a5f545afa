#!/usr/bin/env python3
"""Pull delivery against the official Svix Python SDK (svix==2.9.1): its poller calls, unchanged.

Environment:
  HERALD_URL    base URL of a running Herald (required)
  HERALD_TOKEN  admin API token (required)
  APP_ID        an application to use (required)
  SINK_ID       a polling endpoint of it whose stream has only `order.paid` messages (required)
  MSG_IDS       comma-separated ids of the `order.paid` messages already published, in order (required)

Checks, with `message.poller.poll`, `consumer_poll`, `consumer_seek` and the v2 poller (`consumer_poll`
with a lease, `consumer_commit`):
  - paging through the stream with the iterator returns exactly MSG_IDS, in order, then `done`;
  - a consumer is served the same batch until it comes back with the batch's iterator (at least once);
  - seeking to the epoch replays everything, seeking to now leaves nothing;
  - a v2 batch is served again after its lease ends uncommitted, not after a commit.
Prints `CONSUMER_ITERATOR=<iterator>` (where the consumer `c1`'s last batch, not acknowledged, ended:
it stands after the 4th message) and exits 0, or prints a
`POLLER FAILURE` message and exits 1.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

from svix import Svix, SvixOptions
from svix.api import (
    MessagePollerConsumerPollOptions,
    MessagePollerPollOptions,
)
from svix.api_internal.message_pollerv2 import MessagePollerv2, MessagePollerv2ConsumerPollOptions
from svix.models import PollerV2CommitIn, PollingEndpointConsumerSeekIn


def fail(what: str) -> None:
    print(f"POLLER FAILURE: {what}", file=sys.stderr)
    sys.exit(1)


def expect(condition: bool, what: str) -> None:
    if not condition:
        fail(what)


def main() -> None:
    svix = Svix(os.environ["HERALD_TOKEN"], SvixOptions(server_url=os.environ["HERALD_URL"]))
    app_id = os.environ["APP_ID"]
    sink_id = os.environ["SINK_ID"]
    expected = os.environ["MSG_IDS"].split(",")
    poller = svix.message.poller

    # The stream, two at a time, through the iterator.
    seen: list[str] = []
    iterator = None
    for _ in range(len(expected) + 2):
        page = poller.poll(app_id, sink_id, MessagePollerPollOptions(limit=2, iterator=iterator))
        expect(all(m.event_type == "order.paid" for m in page.data), f"filtered stream: {page}")
        seen += [m.id for m in page.data]
        iterator = page.iterator
        if page.done:
            break
    expect(seen == expected, f"poll pages: {seen} != {expected}")
    first = poller.poll(app_id, sink_id, MessagePollerPollOptions(limit=1))
    expect(first.data[0].payload == {"order": 0}, f"payload: {first.data[0].payload}")
    expect(isinstance(first.data[0].timestamp, datetime.datetime), "timestamp parses")
    narrowed = poller.poll(app_id, sink_id, MessagePollerPollOptions(channel="nowhere"))
    expect(narrowed.data == [] and narrowed.done, f"channel narrowing: {narrowed}")

    # A consumer: the same batch until it is acknowledged by coming back with its iterator.
    batch = poller.consumer_poll(app_id, sink_id, "c1", MessagePollerConsumerPollOptions(limit=2))
    again = poller.consumer_poll(app_id, sink_id, "c1", MessagePollerConsumerPollOptions(limit=2))
    expect([m.id for m in batch.data] == expected[:2], f"first batch: {batch}")
    expect([m.id for m in again.data] == expected[:2], "an unacknowledged batch is served again")
    following = poller.consumer_poll(
        app_id, sink_id, "c1", MessagePollerConsumerPollOptions(limit=2, iterator=batch.iterator)
    )
    expect([m.id for m in following.data] == expected[2:4], f"next batch: {following}")
    # Acknowledge that batch too: c1 now stands after the 4th message.
    rest = poller.consumer_poll(
        app_id, sink_id, "c1", MessagePollerConsumerPollOptions(limit=100, iterator=following.iterator)
    )
    expect([m.id for m in rest.data] == expected[4:], f"rest: {rest}")

    # Seek: back to the epoch replays everything (on another consumer), forward to now leaves nothing.
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    sought = poller.consumer_seek(app_id, sink_id, "c2", PollingEndpointConsumerSeekIn(after=epoch))
    replay = poller.consumer_poll(app_id, sink_id, "c2", MessagePollerConsumerPollOptions(limit=100))
    expect([m.id for m in replay.data] == expected, f"replay after seek({sought.iterator}): {replay}")
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=5)
    poller.consumer_seek(app_id, sink_id, "c2", PollingEndpointConsumerSeekIn(after=future))
    empty = poller.consumer_poll(app_id, sink_id, "c2", MessagePollerConsumerPollOptions())
    expect(empty.data == [] and empty.done, f"after seeking to now: {empty}")

    # v2: a leased batch, served again once the lease ends without a commit; committed, never again. The
    # lease covers everything handed out and not committed, and each poll renews it.
    v2 = MessagePollerv2(svix.message._client, svix.message._httpx_client)
    leased = v2.consumer_poll(
        app_id, sink_id, "v2", MessagePollerv2ConsumerPollOptions(limit=3, lease_duration_ms=300)
    )
    expect([m.id for m in leased.data] == expected[:3], f"v2 batch: {leased}")
    offsets = [m.offset for m in leased.data]
    expect(offsets == sorted(offsets), f"v2 offsets ascend: {offsets}")
    during = v2.consumer_poll(
        app_id, sink_id, "v2", MessagePollerv2ConsumerPollOptions(limit=3, lease_duration_ms=300)
    )
    expect([m.id for m in during.data] == expected[3:], f"during the lease, the next ones: {during}")
    time.sleep(0.5)
    expired = v2.consumer_poll(
        app_id, sink_id, "v2", MessagePollerv2ConsumerPollOptions(limit=3, lease_duration_ms=300)
    )
    expect([m.id for m in expired.data] == expected[:3], f"served again after the lease: {expired}")
    v2.consumer_commit(app_id, sink_id, "v2", PollerV2CommitIn(offset=expired.data[-1].offset))
    time.sleep(0.5)
    after_commit = v2.consumer_poll(
        app_id, sink_id, "v2", MessagePollerv2ConsumerPollOptions(limit=100, lease_duration_ms=300)
    )
    expect([m.id for m in after_commit.data] == expected[3:], f"after the commit: {after_commit}")

    print(f"CONSUMER_ITERATOR={rest.iterator}")


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - report any SDK error as a failure with its trace
        traceback.print_exc()
        fail("unexpected exception")
