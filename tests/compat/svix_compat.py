#!/usr/bin/env python3
"""Wire-compatibility check of Herald against the official Svix Python SDK (svix==2.9.1).

Environment:
  HERALD_URL     base URL of a running Herald, e.g. http://127.0.0.1:8040 (required)
  HERALD_TOKEN   admin API token (required)
  RECEIVER_URL   http(s) URL of a receiver that answers 2xx (required)
  COMPAT_TIMEOUT seconds to wait for a successful attempt (optional, default 20)

Flow: create an application (with uid) -> create an event type -> create an endpoint on
RECEIVER_URL filtered to that event type -> read the endpoint secret -> send a message
(eventType, payload, eventId) -> get the message back -> poll the attempts of the message until
one succeeded -> list endpoints and applications.

Output (stdout), one `KEY=value` per line for the caller to cross-check, the last line being
`MSG_ID=<id>`:
  APP_ID, ENDPOINT_ID, ENDPOINT_SECRET, EVENT_TYPE, EVENT_ID,
  PAYLOAD_JSON (the exact bytes the SDK posted as `payload`, i.e. the body the receiver must get),
  MSG_ID.
Exit status 0 when everything matched; 1 with a `COMPAT FAILURE` message otherwise.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import typing as t
import uuid

import pydantic_core
from svix import Svix, SvixOptions
from svix.api import (
    ApplicationListOptions,
    EndpointListOptions,
    MessageAttemptListByMsgOptions,
    MessageGetOptions,
)
from svix.exceptions import HttpError, HTTPValidationError
from svix.models import (
    ApplicationIn,
    EndpointIn,
    EventTypeIn,
    MessageAttemptTriggerType,
    MessageIn,
    MessageStatus,
    MessageStatusText,
)

MAX_PAGES = 100


class Mismatch(Exception):
    """The server answered, but not what a Svix-compatible server must answer."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Mismatch(what)


def env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        fail("setup", f"environment variable {name} is not set")
    return value


def fail(step: str, detail: str) -> t.NoReturn:
    msg = f"COMPAT FAILURE at step '{step}': {detail}"
    print(msg, file=sys.stderr, flush=True)
    print(msg, flush=True)
    sys.exit(1)


def describe(exc: BaseException) -> str:
    if isinstance(exc, HttpError):
        return f"HTTP {exc.status_code} code={exc.code!r} detail={exc.detail!r}"
    if isinstance(exc, HTTPValidationError):
        return f"HTTP {exc.status_code} validation error: {exc.detail!r}"
    if isinstance(exc, Mismatch):
        return str(exc)
    # Anything else (pydantic ValidationError on a response, connection error, ...).
    return f"{type(exc).__name__}: {exc}"


class Steps:
    """Runs named steps; any exception becomes a clear failure naming the step."""

    def __init__(self) -> None:
        self.current = "setup"

    def __call__(self, name: str):
        self.current = name
        print(f"compat: {name}", file=sys.stderr, flush=True)
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        if os.environ.get("COMPAT_DEBUG"):
            traceback.print_exception(exc_type, exc, tb)
        fail(self.current, describe(exc))


def main() -> None:
    herald_url = env("HERALD_URL")
    token = env("HERALD_TOKEN")
    receiver_url = env("RECEIVER_URL")
    timeout = float(os.environ.get("COMPAT_TIMEOUT", "20"))

    # The SDK's documented way to target a self-hosted server: SvixOptions(server_url=...).
    svix = Svix(token, SvixOptions(server_url=herald_url, timeout=10.0))
    step = Steps()
    suffix = uuid.uuid4().hex[:12]
    app_uid = f"compat-app-{suffix}"
    event_type = f"compat.test.{suffix}"
    event_id = f"compat-evt-{suffix}"
    payload = {
        "type": event_type,
        "user": {"id": 42, "email": "ada@example.com"},
        "note": "h\u00e9llo \u2713",
        "amount": 12.5,
        "items": [1, 2, 3],
    }

    with step("create application"):
        app = svix.application.create(
            ApplicationIn(name=f"Herald compat {suffix}", uid=app_uid, metadata={"suite": "compat"})
        )
        expect(bool(app.id), "ApplicationOut.id is empty")
        expect(app.uid == app_uid, f"ApplicationOut.uid is {app.uid!r}, expected {app_uid!r}")
        expect(app.name == f"Herald compat {suffix}", f"ApplicationOut.name is {app.name!r}")
        expect(app.metadata == {"suite": "compat"}, f"ApplicationOut.metadata is {app.metadata!r}")

    with step("get application by uid"):
        by_uid = svix.application.get(app_uid)
        expect(by_uid.id == app.id, f"GET /app/{app_uid} returned id {by_uid.id!r}, expected {app.id!r}")

    with step("create event type"):
        et = svix.event_type.create(EventTypeIn(name=event_type, description="Herald compat event"))
        expect(et.name == event_type, f"EventTypeOut.name is {et.name!r}, expected {event_type!r}")
        expect(et.description == "Herald compat event", f"EventTypeOut.description is {et.description!r}")

    with step("create endpoint"):
        ep = svix.endpoint.create(
            app.id,
            EndpointIn(url=receiver_url, description="compat receiver", event_types=[event_type]),
        )
        expect(bool(ep.id), "EndpointOut.id is empty")
        expect(ep.url == receiver_url, f"EndpointOut.url is {ep.url!r}, expected {receiver_url!r}")
        expect(
            list(ep.event_types or []) == [event_type],
            f"EndpointOut.eventTypes is {ep.event_types!r}, expected {[event_type]!r} "
            "(SDK 2.9.1 reads `eventTypes`, not `filterTypes`)",
        )
        expect(ep.description == "compat receiver", f"EndpointOut.description is {ep.description!r}")

    with step("get endpoint secret"):
        secret = svix.endpoint.get_secret(app.id, ep.id)
        expect(
            secret.key.startswith("whsec_") or secret.key.startswith("whsk_"),
            f"EndpointSecretOut.key {secret.key[:8]!r}... has neither whsec_ nor whsk_ prefix",
        )

    with step("create message"):
        msg = svix.message.create(
            app.id, MessageIn(event_type=event_type, payload=payload, event_id=event_id)
        )
        expect(bool(msg.id), "MessageOut.id is empty")
        expect(msg.event_type == event_type, f"MessageOut.eventType is {msg.event_type!r}")
        expect(msg.event_id == event_id, f"MessageOut.eventId is {msg.event_id!r}, expected {event_id!r}")
        # The SDK sends ?with_content=false: the payload may be {} or the full payload.
        expect(msg.payload in ({}, payload), f"MessageOut.payload is {msg.payload!r}")

    with step("get message"):
        got = svix.message.get(app.id, msg.id, MessageGetOptions(with_content=True))
        expect(got.id == msg.id, f"GET message returned id {got.id!r}, expected {msg.id!r}")
        expect(got.event_id == event_id, f"GET message eventId is {got.event_id!r}")
        expect(got.event_type == event_type, f"GET message eventType is {got.event_type!r}")
        expect(got.payload == payload, f"GET message payload is {got.payload!r}, expected {payload!r}")

    with step("wait for a successful attempt"):
        deadline = time.monotonic() + timeout
        success = None
        seen: list[str] = []
        while success is None:
            page = svix.message_attempt.list_by_msg(
                app.id, msg.id, MessageAttemptListByMsgOptions(limit=50)
            )
            for attempt in page.data:
                seen.append(
                    f"{attempt.id}:status={int(attempt.status)}/{attempt.status_text.value}"
                    f":code={attempt.response_status_code}"
                )
                expect(attempt.msg_id == msg.id, f"attempt {attempt.id} has msgId {attempt.msg_id!r}")
                if attempt.status == MessageStatus.SUCCESS:
                    success = attempt
                    break
            if success is None:
                if time.monotonic() > deadline:
                    raise Mismatch(
                        f"no attempt with status success (0) within {timeout:.0f}s; "
                        f"attempts seen: {seen[-10:] or 'none'}"
                    )
                time.sleep(0.25)
        expect(success.endpoint_id == ep.id, f"attempt endpointId {success.endpoint_id!r}, expected {ep.id!r}")
        expect(
            success.status_text == MessageStatusText.SUCCESS,
            f"attempt statusText is {success.status_text!r} while status is 0",
        )
        expect(
            200 <= success.response_status_code <= 299,
            f"successful attempt has responseStatusCode {success.response_status_code}",
        )
        expect(
            success.trigger_type == MessageAttemptTriggerType.SCHEDULED,
            f"attempt triggerType is {success.trigger_type!r}, expected 0 (scheduled)",
        )
        expect(success.url == receiver_url, f"attempt url is {success.url!r}, expected {receiver_url!r}")

    with step("list endpoints"):
        found = False
        iterator = None
        for _ in range(MAX_PAGES):
            page = svix.endpoint.list(app.id, EndpointListOptions(limit=50, iterator=iterator))
            found = found or any(e.id == ep.id for e in page.data)
            if found or page.done:
                break
            expect(page.iterator not in (None, iterator), f"endpoint list iterator did not advance ({page.iterator!r})")
            iterator = page.iterator
        expect(found, f"endpoint {ep.id} missing from GET /app/{app.id}/endpoint")

    with step("list applications"):
        found = False
        iterator = None
        for _ in range(MAX_PAGES):
            page = svix.application.list(ApplicationListOptions(limit=100, iterator=iterator))
            found = found or any(a.id == app.id for a in page.data)
            if found or page.done:
                break
            expect(page.iterator not in (None, iterator), f"application list iterator did not advance ({page.iterator!r})")
            iterator = page.iterator
        expect(found, f"application {app.id} missing from GET /app (searched {MAX_PAGES} pages max)")

    # How pydantic serialized `payload` in the POST body: the receiver must get exactly these bytes.
    payload_json = pydantic_core.to_json(payload).decode("utf-8")
    print(f"APP_ID={app.id}")
    print(f"ENDPOINT_ID={ep.id}")
    print(f"ENDPOINT_SECRET={secret.key}")
    print(f"EVENT_TYPE={event_type}")
    print(f"EVENT_ID={event_id}")
    print(f"PAYLOAD_JSON={payload_json}")
    print(f"MSG_ID={msg.id}", flush=True)


if __name__ == "__main__":
    main()
