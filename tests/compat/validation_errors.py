"""Herald's 422 answers through the official `svix` Python SDK: each must raise the SDK's own
`HTTPValidationError`, whose `detail` items name the offending field in `loc`.

Run by crates/herald/tests/api_errors.rs with HERALD_URL and HERALD_TOKEN set; prints one line per case
and exits non-zero, naming the case, at the first one that does not hold.
"""

from __future__ import annotations

import os
import sys
import typing as t
import uuid

from svix import Svix, SvixOptions
from svix.api import (
    ApplicationCreateOptions,
    ApplicationIn,
    ApplicationListOptions,
    EndpointIn,
    MessageCreateOptions,
    MessageIn,
)
from svix.exceptions import HTTPValidationError


def check(case: str, loc: list[str], call: t.Callable[[], object]) -> None:
    try:
        answer = call()
    except HTTPValidationError as error:
        locs = [list(item.loc) for item in error.detail]
        if error.status_code != 422 or loc not in locs:
            sys.exit(f"{case}: expected a 422 naming {loc}, got {error.status_code} with {locs}")
        if error.additional_properties.get("code") != "validation":
            sys.exit(f"{case}: expected code 'validation' beside detail, got {error.additional_properties}")
        print(f"ok: {case}: {loc} {error.detail[0].msg}", flush=True)
        return
    except Exception as error:  # noqa: BLE001 - any other exception is the failure being tested for
        sys.exit(f"{case}: expected HTTPValidationError, got {type(error).__name__}: {error}")
    sys.exit(f"{case}: expected HTTPValidationError, got an answer: {answer!r}")


def main() -> None:
    svix = Svix(os.environ["HERALD_TOKEN"], SvixOptions(server_url=os.environ["HERALD_URL"]))
    suffix = uuid.uuid4().hex[:12]
    check("blank application name", ["body", "name"], lambda: svix.application.create(ApplicationIn(name=" ")))
    check(
        "application list with limit 0",
        ["query", "limit"],
        lambda: svix.application.list(ApplicationListOptions(limit=0)),
    )
    app = svix.application.create(ApplicationIn(name=f"validation {suffix}"))
    check(
        "endpoint with an ftp URL",
        ["body", "url"],
        lambda: svix.endpoint.create(app.id, EndpointIn(url="ftp://example.com/hook")),
    )
    check(
        "message with an invalid event type",
        ["body", "eventType"],
        lambda: svix.message.create(app.id, MessageIn(event_type="has space", payload={})),
    )
    key = f"key-{suffix}"
    first = svix.message.create(
        app.id, MessageIn(event_type="a.b", payload={"n": 1}), MessageCreateOptions(idempotency_key=key)
    )
    again = svix.message.create(
        app.id, MessageIn(event_type="a.b", payload={"n": 1}), MessageCreateOptions(idempotency_key=key)
    )
    if again.id != first.id:
        sys.exit(f"a retried message create made a second message: {first.id} then {again.id}")
    check(
        "idempotency key reused with another message",
        ["header", "idempotency-key"],
        lambda: svix.message.create(
            app.id, MessageIn(event_type="a.b", payload={"n": 2}), MessageCreateOptions(idempotency_key=key)
        ),
    )
    app_key = f"app-key-{suffix}"
    svix.application.create(ApplicationIn(name="first"), ApplicationCreateOptions(idempotency_key=app_key))
    check(
        "idempotency key reused with another application",
        ["header", "idempotency-key"],
        lambda: svix.application.create(ApplicationIn(name="second"), ApplicationCreateOptions(idempotency_key=app_key)),
    )


if __name__ == "__main__":
    main()
