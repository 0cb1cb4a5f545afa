#!/usr/bin/env python3
"""Herald's Svix compatibility suite for the official Python SDK (both pinned generations).

Every operation the installed `svix` package exposes is found by walking the SDK's own client (the
resource properties of `svix.Svix` and the public methods of each resource class). The suite then drives
each of them against a running Herald:

* operations Herald implements run in a scenario below, and each must return the SDK's parsed model (or
  `None` where the SDK declares `-> None`) or raise the SDK's own exception class (`HttpError`,
  `HTTPValidationError`) where the scenario expects an error;
* operations of Svix Cloud products Herald does not offer (NOT_OFFERED below) must raise `HttpError` with
  status 501 and code `not_implemented`;
* an operation the SDK has and the suite knows neither way fails the suite: a new operation in a pinned
  SDK must be looked at, not skipped.

Deliveries go to a receiver this script runs on loopback; each is verified with the SDK's own
`svix.webhooks.Webhook`.

Environment: HERALD_URL, HERALD_TOKEN (required); COMPAT_SIGNATURE_HEADERS, the names Herald was told to
send the signature headers under (`webhook`, the default, `svix` or `both`): each delivery must carry
exactly those sets, and each set alone must verify.
Output: `compat: …` progress on stderr; on success the last stdout line is
`COMPAT OK svix-python <version>: <n> operations (<s> supported, <u> not offered)`.
Exit status 0 on success; 1 with `COMPAT FAILURE …` lines otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.server
import inspect
import json
import os
import re
import sys
import threading
import time
import traceback
import typing as t
import urllib.error
import urllib.request
import uuid

import pydantic
import svix
import svix.api as api
import svix.models as models
from svix import Svix, SvixOptions
from svix.exceptions import HttpError, HTTPValidationError
from svix.webhooks import Webhook

# Operations (dotted SDK names) of Svix Cloud products Herald does not offer, by prefix. Each must answer
# 501 `not_implemented`; docs/svix-compatibility.md lists them.
NOT_OFFERED_PREFIXES = (
    "streaming.",
    "ingest.",
    "connector.",
    "environment.",
    "integration.",
    "operational_webhook.",
    "operational_webhook_endpoint.",
    "statistics.",
    "autoconfig_subscription.",
    "application.destination.",
    "destination.",
    "endpoint.transformation.",
    "authentication.stream_",
    "authentication.get_stream_poller_token",
    "authentication.rotate_stream_poller_token",
)
# Single operations that answer 501 in this version of Herald (sender features not implemented yet).
NOT_OFFERED = {
    "endpoint.transformation_partial_update",
    "endpoint.transformation_get",
    "endpoint.patch_transformation",
}


class Mismatch(Exception):
    """The server answered, but not what a Svix-compatible server must answer."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Mismatch(what)


def discover(client: Svix) -> dict[str, t.Callable[..., t.Any]]:
    """Every operation of the SDK: dotted name -> bound method, found by walking the client's resources."""
    found: dict[str, t.Callable[..., t.Any]] = {}

    def walk(obj: object, prefix: str) -> None:
        for name, member in inspect.getmembers(type(obj)):
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                walk(getattr(obj, name), f"{prefix}{name}.")
            elif inspect.isfunction(member):
                found[f"{prefix}{name}"] = getattr(obj, name)

    walk(client, "")
    return found


class Recorder:
    """Wraps the SDK client: every operation called through it is checked and recorded by dotted name."""

    def __init__(self, target: object, prefix: str, suite: "Suite") -> None:
        self._target, self._prefix, self._suite = target, prefix, suite

    def __getattr__(self, name: str) -> t.Any:
        value = getattr(self._target, name)
        dotted = f"{self._prefix}{name}"
        if inspect.ismethod(value):
            return lambda *a, **kw: self._suite.call(dotted, value, *a, **kw)
        return Recorder(value, f"{dotted}.", self._suite)


class Suite:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.client = Svix(token, SvixOptions(server_url=url, timeout=10.0))
        # Not-offered operations answer 5xx, which the SDK retries: no retries there, to keep the run short.
        self.no_retry = Svix(token, SvixOptions(server_url=url, timeout=10.0, retry_schedule=[]))
        self.sdk = Recorder(self.client, "", self)
        self.called: set[str] = set()
        # Operations called with a request model whose every optional field is None (see `mk_null`).
        self.sent_nulls: set[str] = set()
        self.failures: list[str] = []
        self.expected_status: int | None = None

    def call(self, dotted: str, method: t.Callable[..., t.Any], *args: t.Any, **kwargs: t.Any) -> t.Any:
        """Run one SDK operation: it must return its declared model, or raise the SDK's own error."""
        self.called.add(dotted)
        expected, self.expected_status = self.expected_status, None
        declared = inspect.signature(method).return_annotation
        if any(all_null(arg) for arg in (*args, *kwargs.values())):
            # Recorded now: a call that does not answer as the scenario expects fails the suite anyway.
            self.sent_nulls.add(dotted)
        try:
            result = method(*args, **kwargs)
        except (HttpError, HTTPValidationError) as exc:
            if expected is None:
                raise Mismatch(f"{dotted}: HTTP {exc.status_code} {describe(exc)}") from exc
            expect(
                exc.status_code == expected,
                f"{dotted}: expected HTTP {expected}, got {exc.status_code} {describe(exc)}",
            )
            return exc
        except Mismatch:
            raise
        except Exception as exc:  # raised inside the SDK: the server's answer could not be parsed
            raise Mismatch(f"{dotted}: the SDK crashed on Herald's answer: {type(exc).__name__}: {exc}") from exc
        expect(expected is None, f"{dotted}: expected HTTP {expected}, the call succeeded")
        if declared in (None, "None", inspect.Signature.empty):
            expect(result is None, f"{dotted}: declared -> None, returned {result!r}")
        else:
            expect(isinstance(result, pydantic.BaseModel), f"{dotted}: returned {type(result).__name__}, not a model")
        return result

    def error(self, status: int) -> "Suite":
        """`suite.error(404).sdk.application.get(...)`: the next call must raise the SDK's error with status."""
        self.expected_status = status
        return self


def describe(exc: BaseException) -> str:
    if isinstance(exc, (HttpError, HTTPValidationError)):
        return f"code={getattr(exc, 'code', None)!r} detail={exc.detail!r}"
    return f"{type(exc).__name__}: {exc}"


def mk(model: str | tuple[str, ...], /, **fields: t.Any) -> t.Any:
    """Build the SDK model `model` (the first of several names that exists in this generation), mapping
    field names that differ between generations (`event_types` / `filter_types`)."""
    names = (model,) if isinstance(model, str) else model
    cls = next((getattr(models, n) for n in names if hasattr(models, n)), None)
    if cls is None:
        raise Mismatch(f"none of the models {names} exists in svix {svix.__version__}")
    known = cls.model_fields
    renamed: dict[str, t.Any] = {}
    for key, value in fields.items():
        if key not in known and key == "event_types" and "filter_types" in known:
            key = "filter_types"
        if key not in known:
            continue  # a field this generation does not have
        renamed[key] = value
    return cls(**renamed)


def json_key(field: str, info: t.Any) -> str:
    """The JSON key the SDK sends a model field under."""
    return info.alias or re.sub(r"_(\w)", lambda m: m.group(1).upper(), field)


# Optional fields of SDK models that are not nullable, on purpose (docs/svix-compatibility.md: a PATCH
# cannot clear a name or a URL), by model and JSON key.
NEVER_NULL = {("ApplicationPatch", "name"), ("EndpointPatch", "url")}
# Deprecated names the 1.x models carry beside the current one (JSON keys). The document declares each
# pair exclusive (`not: required: [both]`), as Svix's server takes them as one field: sending both keys,
# even as null, is a 422, so a model with every optional field null sets only the current name.
DEPRECATED_ALIASES = {"rateLimit": "throttleRate"}


def null_fields(cls: type[pydantic.BaseModel]) -> list[str]:
    """The optional fields of the SDK model `cls` that a caller may leave None, each sent as `null`."""
    keys = {field: json_key(field, info) for field, info in cls.model_fields.items()}
    return [
        field
        for field, info in cls.model_fields.items()
        if not info.is_required()
        and (cls.__name__, keys[field]) not in NEVER_NULL
        and DEPRECATED_ALIASES.get(keys[field]) not in keys.values()
    ]


def mk_null(model: str | tuple[str, ...], /, **fields: t.Any) -> t.Any:
    """`mk(model, **fields)` with every other optional field set to None: what the SDK sends for arguments
    left None is `null` in each of them, which must mean the default or absent (issue 16, item 2)."""
    built = mk(model, **fields)
    for field in null_fields(type(built)):
        if field not in built.model_fields_set:
            setattr(built, field, None)  # pydantic counts an assigned field as set, so it is sent
    return built


def all_null(value: t.Any) -> bool:
    """Whether `value` is an SDK model with every optional field explicitly None (see `mk_null`)."""
    return isinstance(value, pydantic.BaseModel) and all(
        field in value.model_fields_set and getattr(value, field) is None for field in null_fields(type(value))
    )


def body_models(method: t.Callable[..., t.Any]) -> list[type[pydantic.BaseModel]]:
    """The request models an SDK operation takes (its body), by its signature."""
    return [
        p.annotation
        for p in inspect.signature(method).parameters.values()
        if inspect.isclass(p.annotation) and issubclass(p.annotation, pydantic.BaseModel)
    ]


def options(name: str, /, **fields: t.Any) -> t.Any:
    """An SDK options dataclass (`svix.api.<Name>`), with only the fields this generation has."""
    cls = getattr(api, name)
    allowed = {f for f in cls.__dataclass_fields__}
    return cls(**{k: v for k, v in fields.items() if k in allowed})


# -------------------------------------------------------------------------------------------------------
# The receiver: records deliveries on loopback
# -------------------------------------------------------------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with outer.lock:
                    outer.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, msg_id: str, timeout: float = 20.0, path: str | None = None) -> tuple[dict[str, str], bytes]:
        """The first delivery of `msg_id` (to `path`, the receiver's URL path, when given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for at, headers, body in self.requests:
                    if msg_id in (headers.get("webhook-id"), headers.get("svix-id")) and path in (None, at):
                        return headers, body
            time.sleep(0.05)
        raise Mismatch(f"message {msg_id} was not delivered within {timeout:.0f}s")


# -------------------------------------------------------------------------------------------------------
# The scenario: every operation Herald implements
# -------------------------------------------------------------------------------------------------------


HEADER_SETS = {
    "webhook": ("webhook-id", "webhook-timestamp", "webhook-signature"),
    "svix": ("svix-id", "svix-timestamp", "svix-signature"),
}


def verify_delivery(secret: str, headers: dict[str, str], body: bytes, mode: str | None = None) -> None:
    """The delivery carries exactly the signature header sets of `mode` (by default the server's, which
    Herald was told to send), and each set on its own verifies with the SDK's `Webhook`."""
    mode = mode or os.environ.get("COMPAT_SIGNATURE_HEADERS", "webhook")
    wanted = ["webhook", "svix"] if mode == "both" else [mode]
    for name, names in HEADER_SETS.items():
        present = [n for n in names if n in headers]
        if name in wanted:
            expect(len(present) == 3, f"signature headers {names} expected in {mode!r} mode, got {sorted(headers)}")
            only = {k: v for k, v in headers.items() if k not in sum(HEADER_SETS.values(), ()) or k in names}
            Webhook(secret).verify(body, only)
        else:
            expect(not present, f"{present} sent in {mode!r} mode")


def herald_http(method: str, path: str, body: t.Any = None) -> tuple[int, t.Any]:
    """A request to Herald without the SDK (for its extensions, which the SDKs have no field for): the
    status and the JSON answer (None when empty)."""
    request = urllib.request.Request(
        f"{os.environ['HERALD_URL']}/api/v1{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {os.environ['HERALD_TOKEN']}", "content-type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request) as answer:
            status, text = answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        status, text = refused.code, refused.read()
    return status, json.loads(text) if text else None


def wait_attempts(s: Suite, app_id: str, msg_id: str, n: int = 1, timeout: float = 20.0) -> list[t.Any]:
    deadline = time.monotonic() + timeout
    while True:
        page = s.sdk.message_attempt.list_by_msg(app_id, msg_id)
        if len(page.data) >= n:
            return page.data
        if time.monotonic() > deadline:
            raise Mismatch(f"message {msg_id}: {len(page.data)} attempts after {timeout:.0f}s, wanted {n}")
        time.sleep(0.1)


def wait_task(s: Suite, task_id: str, timeout: float = 20.0) -> t.Any:
    """The background task once it is no longer running."""
    deadline = time.monotonic() + timeout
    while str((task := s.sdk.background_task.get(task_id)).status) == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    return task


def scenario(s: Suite, receiver: Receiver, step: t.Callable[[str], None]) -> None:
    sdk = s.sdk
    suffix = uuid.uuid4().hex[:10]
    gen2 = hasattr(models, "EndpointUpsertIn")

    step("health")
    sdk.health.get()

    step("applications")
    app = sdk.application.create(mk("ApplicationIn", name=f"compat {suffix}", uid=f"app-{suffix}", metadata={"a": "1"}))
    expect(app.metadata == {"a": "1"}, f"ApplicationOut.metadata {app.metadata!r}")
    expect(sdk.application.get(f"app-{suffix}").id == app.id, "GET by uid answers another app")
    page = sdk.application.list(options("ApplicationListOptions", limit=10))
    expect(isinstance(page.done, bool), "ListResponse.done is not a bool")
    patched = sdk.application.patch(app.id, mk("ApplicationPatch", name=f"renamed {suffix}"))
    expect(patched.name == f"renamed {suffix}", f"patched name {patched.name!r}")
    replace = sdk.application.upsert if gen2 else sdk.application.update
    replaced = replace(app.id, mk("ApplicationIn", name=f"replaced {suffix}", uid=f"app-{suffix}"))
    expect(replaced.name == f"replaced {suffix}", f"replaced name {replaced.name!r}")
    again = sdk.application.get_or_create(mk("ApplicationIn", name="ignored", uid=f"app-{suffix}"))
    expect(again.id == app.id, "get_or_create of an existing uid made a new app")
    # What the SDK sends for arguments left None: `null`, which means the default (issue 16, item 2).
    nulls = sdk.application.create(mk("ApplicationIn", name=f"nulls {suffix}", metadata=None, uid=None, throttle_rate=None))
    expect(nulls.metadata == {}, f"metadata=None gave {nulls.metadata!r}")
    reset = sdk.application.patch(app.id, mk("ApplicationPatch", metadata=None))
    expect(reset.metadata == {}, f"PATCH metadata=None gave {reset.metadata!r}")
    other = sdk.application.create(mk("ApplicationIn", name=f"other {suffix}"))
    sdk.application.delete(other.id)
    s.error(404).sdk.application.get(other.id)

    step("event types")
    et_name = f"compat.{suffix}"
    et = sdk.event_type.create(mk("EventTypeIn", name=et_name, description="compat event"))
    expect(et.name == et_name, f"EventTypeOut.name {et.name!r}")
    expect(sdk.event_type.get(et_name).description == "compat event", "event type description lost")
    sdk.event_type.list(options("EventTypeListOptions", limit=50))
    sdk.event_type.patch(et_name, mk("EventTypePatch", description="patched"))
    replace = sdk.event_type.upsert if gen2 else sdk.event_type.update
    replace(et_name, mk(("EventTypeUpsertIn", "EventTypeUpdate"), description="replaced"))
    # Svix's display group and feature flags are stored and echoed (duplicates collapse); a PATCH to null
    # removes them.
    flagged_name = f"compat.flagged.{suffix}"
    flagged = sdk.event_type.create(
        mk("EventTypeIn", name=flagged_name, description="flagged", feature_flags=["beta", "beta", "gamma"], group_name="Billing events")
    )
    expect(flagged.feature_flags == ["beta", "gamma"] and flagged.group_name == "Billing events", f"on create: {flagged!r}")
    again = sdk.event_type.get(flagged_name)
    expect(again.feature_flags == ["beta", "gamma"] and again.group_name == "Billing events", f"on get: {again!r}")
    changed = sdk.event_type.patch(flagged_name, mk("EventTypePatch", feature_flags=["delta"], group_name=None))
    expect(changed.feature_flags == ["delta"] and changed.group_name is None, f"after a patch: {changed!r}")
    refused = s.error(422).sdk.event_type.create(
        mk("EventTypeIn", name=f"compat.bad.{suffix}", description="bad flag", feature_flags=["no spaces"])
    )
    expect(refused.detail[0].loc[-1] == "featureFlags", f"422 for a bad feature flag names {refused.detail[0].loc!r}")
    gone = f"compat.gone.{suffix}"
    sdk.event_type.create(mk("EventTypeIn", name=gone, description="to delete"))
    sdk.event_type.delete(gone)
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "compat", "version": "1"},
        "webhooks": {
            f"imported.{suffix}": {
                "post": {
                    "description": "imported event",
                    "x-svix-group-name": "Imported",
                    "x-svix-feature-flags": ["imported-flag"],
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/P"}}}},
                }
            }
        },
        "components": {"schemas": {"P": {"type": "object", "properties": {"id": {"type": "string"}}}}},
    }
    preview = sdk.event_type.import_openapi(mk("EventTypeImportOpenApiIn", spec=spec, dry_run=True))
    expect([e.name for e in preview.data.to_modify or []] == [f"imported.{suffix}"], f"dry run {preview!r}")
    s.error(404).sdk.event_type.get(f"imported.{suffix}")
    done = sdk.event_type.import_openapi(mk("EventTypeImportOpenApiIn", spec=spec))
    expect(done.data.modified == [f"imported.{suffix}"], f"import modified {done.data.modified!r}")
    imported = sdk.event_type.get(f"imported.{suffix}")
    expect(imported.description == "imported event", f"imported description {imported.description!r}")
    expect(imported.schemas == {"1": {"type": "object", "properties": {"id": {"type": "string"}}}}, "imported schema")
    expect(imported.group_name == "Imported" and imported.feature_flags == ["imported-flag"], f"imported extensions {imported!r}")
    # `specRaw` takes the document as text, YAML as well as JSON (how OpenAPI documents are mostly written).
    yaml_spec = (
        "openapi: 3.1.0\n"
        "info: {title: compat, version: '1'}\n"
        "webhooks:\n"
        f"  imported-yaml.{suffix}:\n"
        "    post:\n"
        "      description: from YAML\n"
        "      requestBody:\n"
        "        content:\n"
        "          application/json:\n"
        "            schema: {type: object}\n"
    )
    from_yaml = sdk.event_type.import_openapi(mk("EventTypeImportOpenApiIn", spec_raw=yaml_spec))
    expect(from_yaml.data.modified == [f"imported-yaml.{suffix}"], f"YAML import modified {from_yaml.data.modified!r}")
    expect(sdk.event_type.get(f"imported-yaml.{suffix}").description == "from YAML", "YAML import description")
    bad_yaml = s.error(422).sdk.event_type.import_openapi(mk("EventTypeImportOpenApiIn", spec_raw="webhooks: [unclosed"))
    expect(bad_yaml.detail[0].loc[-1] == "specRaw", f"422 for bad specRaw names {bad_yaml.detail[0].loc!r}")

    step("endpoints")
    ep = sdk.endpoint.create(
        app.id,
        mk("EndpointIn", url=receiver.url, description="compat", event_types=[et_name], metadata={"k": "v"}),
    )
    expect(ep.url == receiver.url, f"EndpointOut.url {ep.url!r}")
    expect(sdk.endpoint.get(app.id, ep.id).id == ep.id, "GET endpoint answers another endpoint")
    # Newest first by default, as Svix lists endpoints; `order` turns it round.
    newer = sdk.endpoint.create(app.id, mk("EndpointIn", url=receiver.url, description="newer"))
    newest_first = [e.id for e in sdk.endpoint.list(app.id, options("EndpointListOptions", limit=10)).data]
    expect(newest_first[:2] == [newer.id, ep.id], f"endpoint.list default order {newest_first!r}")
    oldest_first = sdk.endpoint.list(app.id, options("EndpointListOptions", limit=10, order=api.Ordering.ASCENDING))
    expect([e.id for e in oldest_first.data][:2] == [ep.id, newer.id], f"order=ascending {oldest_first.data!r}")
    sdk.endpoint.delete(app.id, newer.id)
    sdk.endpoint.patch(app.id, ep.id, mk("EndpointPatch", description="patched"))
    replace = sdk.endpoint.upsert if gen2 else sdk.endpoint.update
    replace(app.id, ep.id, mk(("EndpointUpsertIn", "EndpointUpdate"), url=receiver.url, event_types=[et_name]))
    secret = sdk.endpoint.get_secret(app.id, ep.id)
    expect(secret.key.startswith("whsec_"), "EndpointSecretOut.key has no whsec_ prefix")
    nulls_ep = sdk.endpoint.create(
        app.id,
        mk(
            "EndpointIn",
            url=receiver.url,
            metadata=None,
            description=None,
            uid=None,
            channels=None,
            secret=None,
            event_types=None,
            throttle_rate=None,
            disabled=None,
        ),
    )
    expect(nulls_ep.metadata == {} and nulls_ep.description == "", "null fields on endpoint create")
    nulls_ep = sdk.endpoint.patch(
        app.id, nulls_ep.id, mk("EndpointPatch", metadata=None, description=None, channels=None, event_types=None)
    )
    expect(nulls_ep.metadata == {} and not nulls_ep.channels, "null fields on endpoint patch")
    sdk.endpoint.delete(app.id, nulls_ep.id)
    set_headers = sdk.endpoint.set_headers if gen2 else sdk.endpoint.update_headers
    set_headers(app.id, ep.id, mk("EndpointHeadersIn", headers={"X-Compat": "1", "X-Gone": "1"}))
    sdk.endpoint.patch_headers(
        app.id, ep.id, mk("EndpointHeadersPatchIn", headers={"X-Other": "2"}, delete_headers=["x-gone"])
    )
    headers = sdk.endpoint.get_headers(app.id, ep.id)
    # Names come back as spelled; deleteHeaders removes (case-insensitively).
    expect(headers.headers == {"X-Compat": "1", "X-Other": "2"}, f"headers {headers.headers!r}")
    stats = sdk.endpoint.get_stats(app.id, ep.id)
    expect(stats.success >= 0 and stats.canceled >= 0, "EndpointStats.success/canceled")
    if gen2:  # 1.x has no attempt-stats operation
        counted = sdk.endpoint.get_attempt_stats(app.id, ep.id)
        expect(counted.success == 0 and counted.fail == 0, f"attempt stats before any message: {counted!r}")
    active = sdk.message.precheck(app.id, mk("MessagePrecheckIn", event_type=et_name))
    expect(active.active is True, "precheck: the endpoint subscribed to the event type is not active")
    idle = sdk.message.precheck(app.id, mk("MessagePrecheckIn", event_type=f"{et_name}.nobody", channels=["x"]))
    expect(idle.active is False, "precheck: an event type no endpoint takes is active")
    sink_id = None
    if hasattr(s.client.message, "poller"):  # every 2.x; some 1.x have no poller
        # Pull delivery: a polling endpoint (created over HTTP, a Herald resource the SDKs have no operation
        # for), read through the poller before any message is published.
        status, sink = herald_http("POST", f"/app/{app.id}/polling-endpoint", {"eventTypes": [et_name]})
        expect(status == 201, f"polling endpoint: HTTP {status} {sink!r}")
        sink_id = sink["id"]
        head = sdk.message.poller.poll(app.id, sink_id)
        expect(head.done and isinstance(head.iterator, str), f"poller.poll on an empty stream: {head!r}")
        polled = sdk.message.poller.consumer_poll(app.id, sink_id, "compat")
        expect(polled.done, f"poller.consumer_poll: {polled!r}")
        sought = sdk.message.poller.consumer_seek(
            app.id, sink_id, "compat", mk("PollingEndpointConsumerSeekIn", after=dt.datetime.now(dt.timezone.utc))
        )
        expect(isinstance(sought.iterator, str), f"poller.consumer_seek: {sought!r}")
    # Headers given at creation keep their spelling too.
    extra = sdk.endpoint.create(app.id, mk("EndpointIn", url=receiver.url, headers={"X-Made-Here": "1"}))
    made = sdk.endpoint.get_headers(app.id, extra.id).headers
    expect(made == {"X-Made-Here": "1"}, f"headers given on create came back as {made!r}")
    sdk.endpoint.delete(app.id, extra.id)
    s.error(404).sdk.endpoint.get(app.id, extra.id)
    # A disabled endpoint: it exists but gets no deliveries.
    extra_ep = sdk.endpoint.create(app.id, mk("EndpointIn", url=receiver.url, disabled=True))

    step("messages and deliveries")
    payload = {"type": et_name, "n": 1, "text": "h\u00e9llo"}
    msg = sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload=payload, event_id=f"evt-{suffix}"))
    expect(msg.event_type == et_name, f"MessageOut.eventType {msg.event_type!r}")
    if sink_id:
        # The message is on the polling endpoint's stream: the poller reads it with its payload, the consumer
        # (sought to before it) gets it until it commits, and a seek back serves it again.
        page = sdk.message.poller.poll(app.id, sink_id)
        found = [m for m in page.data if m.id == msg.id]
        expect(
            len(found) == 1 and found[0].event_type == et_name and found[0].payload == payload,
            f"poller.poll after publishing: {page.data!r}",
        )
        first = sdk.message.poller.consumer_poll(app.id, sink_id, "compat")
        expect([m.id for m in first.data] == [msg.id], f"poller.consumer_poll after publishing: {first!r}")
        # Coming back with the answer's iterator commits it (until then the page would be served again).
        again = sdk.message.poller.consumer_poll(
            app.id, sink_id, "compat", options("MessagePollerConsumerPollOptions", iterator=first.iterator)
        )
        expect(not again.data, f"poller.consumer_poll after committing serves the message again: {again!r}")
        sdk.message.poller.consumer_seek(
            app.id, sink_id, "compat", mk("PollingEndpointConsumerSeekIn", after=msg.timestamp - dt.timedelta(seconds=1))
        )
        replayed = sdk.message.poller.consumer_poll(app.id, sink_id, "compat")
        expect(msg.id in [m.id for m in replayed.data], f"poller.consumer_poll after a seek back: {replayed!r}")
    got = sdk.message.get(app.id, msg.id, options("MessageGetOptions", with_content=True))
    expect(got.payload == payload, f"MessageOut.payload {got.payload!r}")
    sdk.message.list(app.id, options("MessageListOptions", limit=10))
    # An inline `application` creates the app named in the path (its uid) with the message.
    inline = sdk.message.create(
        f"inline-{suffix}",
        mk("MessageIn", event_type=et_name, payload={"a": 1}, application=mk("ApplicationIn", name="inline")),
    )
    expect(sdk.application.get(f"inline-{suffix}").name == "inline", "inline application not created")
    expect(bool(inline.id), "MessageOut.id of the inline-app message")
    headers, body = receiver.wait_for(msg.id)
    verify_delivery(secret.key, headers, body)
    expect(json.loads(body) == payload, f"delivered body {body!r}")
    attempts = wait_attempts(s, app.id, msg.id)
    expect(attempts[0].msg_id == msg.id, "attempt msgId")
    one = sdk.message_attempt.get(app.id, msg.id, attempts[0].id)
    expect(one.id == attempts[0].id and one.endpoint_id == ep.id, f"GET attempt answered {one.id!r}")
    s.error(404).sdk.message_attempt.get(app.id, msg.id, "atmpt_2AAAAAAAAAAAAAAAAAAAAAAAAAA")
    only_ep = sdk.message_attempt.list_by_msg(app.id, msg.id, options("MessageAttemptListByMsgOptions", endpoint_id=extra_ep.id))
    expect(only_ep.data == [], f"attempts filtered by another endpoint: {[a.id for a in only_ep.data]}")
    mine = sdk.message_attempt.list_by_msg(app.id, msg.id, options("MessageAttemptListByMsgOptions", endpoint_id=ep.id))
    expect([a.id for a in mine.data] == [a.id for a in attempts], "attempts filtered by their own endpoint")
    with_msg = sdk.message_attempt.list_by_endpoint(
        app.id, ep.id, options("MessageAttemptListByEndpointOptions", with_msg=True)
    )
    expect(with_msg.data[0].msg is not None and with_msg.data[0].msg.id == msg.id, "with_msg=true gave no msg")
    sdk.message_attempt.list_by_endpoint(app.id, ep.id)
    sdk.message_attempt.list_attempted_destinations(app.id, msg.id)
    sdk.message_attempt.list_attempted_messages(app.id, ep.id)
    sdk.message_attempt.resend(app.id, msg.id, ep.id)
    wait_attempts(s, app.id, msg.id, 2)
    # The delivery and its resend are counted (both succeeded).
    delivered_stats = sdk.endpoint.get_stats(app.id, ep.id)
    expect(delivered_stats.success >= 1, f"endpoint stats after a delivery: {delivered_stats!r}")
    if gen2:
        counted = sdk.endpoint.get_attempt_stats(app.id, ep.id)
        expect(counted.success >= 2 and counted.fail == 0, f"attempt stats after a delivery and a resend: {counted!r}")

    step("secret rotation, replay and recovery")
    sdk.endpoint.rotate_secret(app.id, ep.id, mk("EndpointSecretRotateIn"))
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    sdk.endpoint.replay_missing(app.id, ep.id, mk("ReplayIn", since=since))
    recovered = sdk.endpoint.recover(app.id, ep.id, mk("RecoverIn", since=since))
    sdk.background_task.get(recovered.id)
    # The message was delivered (and resent): a bulk replay of its event type sends it once more.
    replay = sdk.endpoint.bulk_replay(app.id, ep.id, mk("BulkReplayIn", since=since, event_types=[et_name]))
    expect(str(replay.task) == "endpoint.bulk-replay", f"ReplayOut.task {replay.task!r}")
    task = wait_task(s, replay.id)
    expect(str(task.status) == "finished" and task.data.get("messagesSent") == 1, f"bulk replay task {task!r}")
    wait_attempts(s, app.id, msg.id, 3)
    sdk.message.expunge_content(app.id, msg.id)
    if gen2:  # 1.x has no bulk expunge
        bulk = sdk.message.bulk_expunge_content(app.id, mk("BulkExpungeContentsIn", ids=[msg.id, "msg_unknown"]))
        expect(
            {k: str(v) for k, v in bulk.results.items()} == {msg.id: "expunged", "msg_unknown": "not-found"},
            f"bulk expunge results {bulk.results!r}",
        )
    sdk.message_attempt.expunge_content(app.id, msg.id, attempts[0].id)
    expect(sdk.message_attempt.get(app.id, msg.id, attempts[0].id).response == "", "attempt response not expunged")
    purge = sdk.message.expunge_all_contents(app.id)
    expect(str(purge.task) == "application.purge_content", f"ExpungeAllContentsOut.task {purge.task!r}")
    task = wait_task(s, purge.id)
    expect(str(task.status) == "finished" and "messagesPurged" in task.data, f"expunge-all task {task!r}")
    listed = sdk.background_task.list(options("BackgroundTaskListOptions", limit=250))
    expect(purge.id in [t.id for t in listed.data], f"background_task.list lacks {purge.id}")
    finished = sdk.background_task.list(options("BackgroundTaskListOptions", task=models.BackgroundTaskType("endpoint.bulk-replay")))
    expect([t.id for t in finished.data] == [replay.id], f"background_task.list by kind: {finished!r}")

    step("message tags")
    tag = f"order/{suffix}#1"
    tagged = sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={"tagged": 1}, tags=[tag, "compat"]))
    expect(sorted(tagged.tags or []) == sorted([tag, "compat"]), f"MessageOut.tags on create {tagged.tags!r}")
    expect(sorted(sdk.message.get(app.id, tagged.id).tags or []) == sorted([tag, "compat"]), "MessageOut.tags on get")
    listed = sdk.message.list(app.id, options("MessageListOptions", tag=tag))
    expect([m.id for m in listed.data] == [tagged.id], f"message.list tag={tag!r}: {[m.id for m in listed.data]}")
    expect(sdk.message.list(app.id, options("MessageListOptions", tag=f"none-{suffix}")).data == [], "unknown tag listed")
    # Svix's bounds: at most 5 tags, each of `[a-zA-Z0-9-_./\\#]`, 1-128 characters.
    refused = s.error(422).sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={}, tags=["no spaces"]))
    expect(refused.detail[0].loc[-1] == "tags", f"422 for a bad tag names {refused.detail[0].loc!r}")
    s.error(422).sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={}, tags=[f"t{i}" for i in range(6)]))
    wait_attempts(s, app.id, tagged.id)
    by_endpoint = sdk.message_attempt.list_by_endpoint(
        app.id, ep.id, options("MessageAttemptListByEndpointOptions", tag=tag, with_msg=True)
    )
    expect({a.msg_id for a in by_endpoint.data} == {tagged.id}, f"attempts by endpoint, tag: {by_endpoint.data!r}")
    expect(sorted(by_endpoint.data[0].msg.tags or []) == sorted([tag, "compat"]), "with_msg message has no tags")
    expect(len(sdk.message_attempt.list_by_msg(app.id, tagged.id, options("MessageAttemptListByMsgOptions", tag=tag)).data) == 1,
           "attempts by message, its own tag")
    expect(sdk.message_attempt.list_by_msg(app.id, msg.id, options("MessageAttemptListByMsgOptions", tag=tag)).data == [],
           "attempts by message, a tag it does not carry")
    attempted = sdk.message_attempt.list_attempted_messages(
        app.id, ep.id, options("MessageAttemptListAttemptedMessagesOptions", tag=tag)
    )
    expect([m.id for m in attempted.data] == [tagged.id], f"attempted messages, tag: {[m.id for m in attempted.data]}")
    # A bulk replay filtered by the tag sends that message again, and only it.
    by_tag = sdk.endpoint.bulk_replay(app.id, ep.id, mk("BulkReplayIn", since=since, tag=tag))
    task = wait_task(s, by_tag.id)
    expect(str(task.status) == "finished" and task.data.get("messagesSent") == 1, f"bulk replay by tag {task!r}")
    wait_attempts(s, app.id, tagged.id, 2)
    refused = s.error(422).sdk.endpoint.bulk_replay(app.id, ep.id, mk("BulkReplayIn", since=since, tag="no spaces"))
    expect(refused.detail[0].loc[-1] == "tag", f"422 for a bad bulk-replay tag names {refused.detail[0].loc!r}")

    step("listing options")
    # Every option the SDKs' listings send is taken (the document check below makes sure of it; these show
    # each one working): applications and event types in either order, applications by their endpoints,
    # attempts and an endpoint's messages by channel, event type and time.
    bare = sdk.application.create(mk("ApplicationIn", name=f"bare {suffix}"))
    apps = sdk.application.list(options("ApplicationListOptions", limit=250)).data
    newest = sdk.application.list(options("ApplicationListOptions", limit=250, order=api.Ordering.DESCENDING)).data
    expect([a.id for a in newest] == [a.id for a in reversed(apps)], "application.list order=descending")
    with_endpoints = sdk.application.list(
        options("ApplicationListOptions", limit=250, exclude_apps_with_no_endpoints=True, exclude_apps_with_disabled_endpoints=True)
    ).data
    expect(app.id in [a.id for a in with_endpoints] and bare.id not in [a.id for a in with_endpoints],
           f"exclude_apps_with_no_endpoints: {[a.id for a in with_endpoints]}")
    sdk.application.delete(bare.id)
    names = [e.name for e in sdk.event_type.list(options("EventTypeListOptions", limit=250)).data]
    backwards = sdk.event_type.list(options("EventTypeListOptions", limit=250, order=api.Ordering.DESCENDING)).data
    expect([e.name for e in backwards] == sorted(names, reverse=True), f"event_type.list order=descending {backwards!r}")
    on_channel = sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={"on": "channel"}, channels=[f"ch-{suffix}"]))
    wait_attempts(s, app.id, on_channel.id)
    by_channel = sdk.message_attempt.list_by_endpoint(
        app.id, ep.id, options("MessageAttemptListByEndpointOptions", channel=f"ch-{suffix}")
    ).data
    expect(by_channel and all(a.msg_id == on_channel.id for a in by_channel), f"attempts by endpoint, channel: {by_channel!r}")
    other_channel = sdk.message_attempt.list_by_msg(app.id, msg.id, options("MessageAttemptListByMsgOptions", channel=f"ch-{suffix}"))
    expect(other_channel.data == [], "attempts by message, a channel it is not on")
    attempted = lambda **kw: [  # noqa: E731
        m.id for m in sdk.message_attempt.list_attempted_messages(
            app.id, ep.id, options("MessageAttemptListAttemptedMessagesOptions", limit=250, **kw)
        ).data
    ]
    expect(attempted(channel=f"ch-{suffix}") == [on_channel.id], "attempted messages, channel")
    expect(on_channel.id not in attempted(event_types=[f"{et_name}.other"]), "attempted messages, event_types")
    expect(on_channel.id in attempted(event_types=[et_name]), "attempted messages, its event type")
    expect(on_channel.id not in attempted(before=on_channel.timestamp), "attempted messages, before")
    expect(attempted(after=on_channel.timestamp)[:1] == [on_channel.id], "attempted messages, after")

    step("scheduled delivery")
    at = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)).replace(microsecond=0) + dt.timedelta(seconds=1)
    scheduled = sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={"scheduled": 1}, deliver_at=at))
    expect(scheduled.deliver_at == at, f"MessageOut.deliverAt {scheduled.deliver_at!r}, sent {at!r}")
    expect(sdk.message.get(app.id, scheduled.id).deliver_at == at, "MessageOut.deliverAt on get")
    late = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=25)
    refused = s.error(422).sdk.message.create(app.id, mk("MessageIn", event_type=et_name, payload={}, deliver_at=late))
    expect(refused.detail[0].loc[-1] == "deliverAt", f"422 past the horizon names {refused.detail[0].loc!r}")
    receiver.wait_for(scheduled.id)
    first = wait_attempts(s, app.id, scheduled.id)[-1]
    expect(first.timestamp >= at, f"attempted at {first.timestamp!r}, before its deliverAt {at!r}")

    step("send example")
    example_type = f"compat.example.{suffix}"
    schema = {"type": "object", "examples": [{"first": 1}, {"second": 2}]}
    sdk.event_type.create(mk("EventTypeIn", name=example_type, description="with examples", schemas={"1": schema}))
    # The endpoint does not subscribe to this event type: the example goes to it all the same, and only to it.
    sent = sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type=example_type, example_index=1))
    expect(sent.event_type == example_type and sent.payload == {"second": 2}, f"send_example answered {sent!r}")
    headers, body = receiver.wait_for(sent.id)
    # Signed with the endpoint's key as rotated above.
    verify_delivery(sdk.endpoint.get_secret(app.id, ep.id).key, headers, body)
    expect(json.loads(body) == {"second": 2}, f"example delivered as {body!r}")
    destinations = sdk.message_attempt.list_attempted_destinations(app.id, sent.id)
    expect([d.id for d in destinations.data] == [ep.id], f"the example went to {[d.id for d in destinations.data]}")
    first_example = sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type=example_type))
    expect(first_example.payload == {"first": 1}, f"the default example is the first: {first_example.payload!r}")
    if "payload" in models.EventExampleIn.model_fields:  # 2.x: the caller's payload instead of the example
        custom = sdk.endpoint.send_example(
            app.id, ep.id, mk("EventExampleIn", event_type=example_type, payload={"custom": [1, 2]})
        )
        expect(custom.payload == {"custom": [1, 2]}, f"send_example with a payload answered {custom.payload!r}")
        _, body = receiver.wait_for(custom.id)
        expect(json.loads(body) == {"custom": [1, 2]}, f"the given payload delivered as {body!r}")
    ping = sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type="svix.ping"))
    expect(ping.payload == {"success": True}, f"svix.ping example {ping.payload!r}")
    refused = s.error(422).sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type=et_name))
    expect(refused.detail[0].loc[-1] == "eventType", f"422 without an example names {refused.detail[0].loc!r}")
    s.error(422).sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type=example_type, example_index=2))
    s.error(404).sdk.endpoint.send_example(app.id, ep.id, mk("EventExampleIn", event_type=f"compat.none.{suffix}"))

    step("signature header names per endpoint")
    # Each endpoint may choose the names of its signature headers (Herald's `signatureHeaders`, set over
    # HTTP: the SDKs have no field for it); one message reaches an endpoint of each choice, and of none
    # (the server's), each delivery with exactly its sets, each set verified by the SDK's `Webhook`.
    names_type = f"compat.names.{suffix}"
    choices = {"webhook": "webhook", "svix": "svix", "both": "both", "server": None}
    by_choice = {}
    for choice, names in choices.items():
        body = {"url": f"{receiver.url}/{choice}", "filterTypes": [names_type], "signatureHeaders": names}
        status, created = herald_http("POST", f"/app/{app.id}/endpoint", body)
        expect(status == 201 and created.get("signatureHeaders") == names, f"signatureHeaders {names!r}: {status} {created!r}")
        # The SDK reads the endpoint (and ignores the extension).
        expect(sdk.endpoint.get(app.id, created["id"]).id == created["id"], "endpoint.get of an endpoint with signatureHeaders")
        by_choice[choice] = created["id"]
    named = sdk.message.create(app.id, mk("MessageIn", event_type=names_type, payload={"names": True}))
    for choice, names in choices.items():
        headers, body = receiver.wait_for(named.id, path=f"/hook/{choice}")
        key = sdk.endpoint.get_secret(app.id, by_choice[choice]).key
        verify_delivery(key, headers, body, mode=names)
    # A PATCH to null gives the endpoint back to the server's setting; anything but the three names is a 422.
    status, patched = herald_http("PATCH", f"/app/{app.id}/endpoint/{by_choice['svix']}", {"signatureHeaders": None})
    expect(status == 200 and "signatureHeaders" not in patched, f"PATCH signatureHeaders null: {status} {patched!r}")
    status, refused = herald_http("PATCH", f"/app/{app.id}/endpoint/{by_choice['svix']}", {"signatureHeaders": "x-svix"})
    expect(status == 422 and refused["detail"][0]["loc"] == ["body", "signatureHeaders"], f"a bad name: {status} {refused!r}")
    for endpoint_id in by_choice.values():
        sdk.endpoint.delete(app.id, endpoint_id)

    step("portal access")
    access = sdk.authentication.app_portal_access(app.id, mk("AppPortalAccessIn"))
    expect(bool(access.token), "AppPortalAccessOut.token is empty")
    expect(access.url.startswith("http"), f"AppPortalAccessOut.url {access.url!r} is not absolute")
    if not gen2:  # the deprecated dashboard access, 1.x only
        dashboard = sdk.authentication.dashboard_access(app.id)
        expect(bool(dashboard.token) and dashboard.url.startswith("http"), f"dashboard access {dashboard!r}")
    # expire_all with sessionIds ends only the tokens issued for those sessions.
    session = sdk.authentication.app_portal_access(app.id, mk("AppPortalAccessIn", session_id="compat-session"))
    sdk.authentication.expire_all(app.id, mk("ApplicationTokenExpireIn", session_ids=["compat-session"]))
    try:
        Svix(session.token, SvixOptions(server_url=s.url, timeout=10.0, retry_schedule=[])).application.get(app.id)
        raise Mismatch("a token of an expired session still works")
    except HttpError as exc:
        expect(exc.status_code == 401, f"a token of an expired session got {exc.status_code}")
    # A logout ends the portal token that makes it (still working: not of that session); the admin token
    # cannot log out.
    portal = Svix(access.token, SvixOptions(server_url=s.url, timeout=10.0))
    s.call("authentication.logout", portal.authentication.logout)
    try:
        portal.application.get(app.id)
        raise Mismatch("a logged-out portal token still works")
    except HttpError as exc:
        expect(exc.status_code == 401, f"a logged-out token got {exc.status_code}")
    s.error(403).sdk.authentication.logout()
    sdk.authentication.expire_all(app.id, mk("ApplicationTokenExpireIn"))

    step("null for every optional field")
    # What the SDK sends for every argument left None: `null` in each optional field of the body, which
    # means the default or absent (issue 16, item 2). Every operation that takes a body is called so once
    # (main() checks none is missed), on an application of its own.
    upsert = sdk.application.upsert if gen2 else sdk.application.update
    void = sdk.application.create(mk_null("ApplicationIn", name=f"all null {suffix}"))
    expect(void.metadata == {} and void.uid is None, f"ApplicationIn with every optional field None: {void!r}")
    sdk.application.get_or_create(mk_null("ApplicationIn", name=f"all null too {suffix}"))
    sdk.application.patch(void.id, mk_null("ApplicationPatch"))
    upsert(void.id, mk_null("ApplicationIn", name=f"all null {suffix}"))
    void_type = f"compat.null.{suffix}"
    sdk.event_type.create(mk_null("EventTypeIn", name=void_type, description="all null"))
    sdk.event_type.patch(void_type, mk_null("EventTypePatch"))
    (sdk.event_type.upsert if gen2 else sdk.event_type.update)(
        void_type, mk_null(("EventTypeUpsertIn", "EventTypeUpdate"), description="all null")
    )
    sdk.event_type.import_openapi(mk_null("EventTypeImportOpenApiIn", spec=spec))
    # With both `spec` and `specRaw` null there is no document, as with neither sent.
    refused = s.error(422).sdk.event_type.import_openapi(mk_null("EventTypeImportOpenApiIn"))
    expect(refused.detail[0].loc[-1] == "spec", f"422 for an import of nothing names {refused.detail[0].loc!r}")
    void_ep = sdk.endpoint.create(void.id, mk_null("EndpointIn", url=receiver.url))
    sdk.endpoint.patch(void.id, void_ep.id, mk_null("EndpointPatch"))
    (sdk.endpoint.upsert if gen2 else sdk.endpoint.update)(
        void.id, void_ep.id, mk_null(("EndpointUpsertIn", "EndpointUpdate"), url=receiver.url)
    )
    sdk.endpoint.patch_headers(void.id, void_ep.id, mk_null("EndpointHeadersPatchIn", headers={"X-Null": "1"}))
    sdk.endpoint.rotate_secret(void.id, void_ep.id, mk_null("EndpointSecretRotateIn"))
    expect(sdk.message.precheck(void.id, mk_null("MessagePrecheckIn", event_type=void_type)).active, "precheck, all null")
    void_msg = sdk.message.create(void.id, mk_null("MessageIn", event_type=void_type, payload={"all": None}))
    headers, body = receiver.wait_for(void_msg.id)
    verify_delivery(sdk.endpoint.get_secret(void.id, void_ep.id).key, headers, body)
    expect(headers.get("x-null") == "1", f"the custom header set with deleteHeaders null: {headers!r}")
    example = sdk.endpoint.send_example(void.id, void_ep.id, mk_null("EventExampleIn", event_type="svix.ping"))
    expect(example.payload == {"success": True}, f"send_example, all null: {example.payload!r}")
    sdk.endpoint.replay_missing(void.id, void_ep.id, mk_null("ReplayIn", since=since))
    sdk.endpoint.recover(void.id, void_ep.id, mk_null("RecoverIn", since=since))
    wait_task(s, sdk.endpoint.bulk_replay(void.id, void_ep.id, mk_null("BulkReplayIn", since=since)).id)
    if gen2:
        sdk.message.bulk_expunge_content(void.id, mk_null("BulkExpungeContentsIn"))
    sdk.authentication.app_portal_access(void.id, mk_null("AppPortalAccessIn"))
    sdk.authentication.expire_all(void.id, mk_null("ApplicationTokenExpireIn"))
    sdk.application.delete(void.id)


# -------------------------------------------------------------------------------------------------------
# Not offered: each must answer 501 not_implemented
# -------------------------------------------------------------------------------------------------------


def placeholder(param: inspect.Parameter) -> t.Any:
    """An argument for a not-offered operation: the request never gets past routing, so any will do."""
    annotation = param.annotation
    if annotation is str or annotation == "str":
        return "placeholder"
    if inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel):
        return annotation.model_construct()
    raise Mismatch(f"no placeholder for parameter {param.name}: {annotation!r}")


def not_offered(name: str) -> bool:
    return name in NOT_OFFERED or name.startswith(NOT_OFFERED_PREFIXES)


def check_not_offered(s: Suite, name: str) -> None:
    method = discover(s.no_retry)[name]
    params = [p for p in inspect.signature(method).parameters.values() if p.default is inspect.Parameter.empty]
    try:
        method(*[placeholder(p) for p in params])
    except HttpError as exc:
        expect(
            exc.status_code == 501 and exc.code == "not_implemented",
            f"{name}: expected 501 not_implemented, got {exc.status_code} {describe(exc)}",
        )
        return
    except HTTPValidationError as exc:
        raise Mismatch(f"{name}: expected 501 not_implemented, got {exc.status_code} {describe(exc)}") from exc
    except Exception as exc:
        raise Mismatch(f"{name}: the SDK crashed on Herald's answer: {type(exc).__name__}: {exc}") from exc
    raise Mismatch(f"{name}: expected 501 not_implemented, the call succeeded")


# SDK request models whose schema the document names differently.
DOCUMENT_SCHEMA = {
    "BulkExpungeContentsIn": "BulkExpungeIn",
    "EventTypeImportOpenApiIn": "EventTypeImportIn",
    "RecoverIn": "RepairIn",
    "ReplayIn": "RepairIn",
    "EndpointUpsertIn": "EndpointUpdate",
    "EventTypeUpsertIn": "EventTypeUpdate",
}

def check_document(operations: dict[str, t.Callable[..., t.Any]]) -> list[str]:
    """What the SDK can send, held against the document the server serves: for every operation Herald
    implements, each query and header parameter of its options must be declared for that operation (the
    server refuses undeclared ones), and each optional field of its request body must be a property the
    document declares, nullable (the SDK sends `null` for a field set to None). So a newer pinned SDK that
    sends something new fails here instead of being refused (or ignored) at a user's call."""
    with urllib.request.urlopen(f"{os.environ['HERALD_URL']}/api/v1/openapi.json") as answer:
        document = json.load(answer)
    schemas, components = document["components"]["schemas"], document["components"].get("parameters", {})
    problems: list[str] = []

    def declared(path: str, method: str) -> set[tuple[str, str]]:
        item = document["paths"][path]
        found = set()
        for parameter in item.get("parameters", []) + item[method].get("parameters", []):
            parameter = components[parameter["$ref"].split("/")[-1]] if "$ref" in parameter else parameter
            found.add((parameter["in"], parameter["name"]))
        return found

    def nullable(schema: dict[str, t.Any]) -> bool:
        kinds = schema.get("type")
        return kinds == "null" or (isinstance(kinds, list) and "null" in kinds) or any(
            nullable(option) for option in schema.get("oneOf", []) + schema.get("anyOf", [])
        )

    for name, method in sorted(operations.items()):
        if not_offered(name):
            continue
        found = re.search(r'method="(\w+)",\s*path="([^"]+)"', inspect.getsource(method))
        if not found:
            problems.append(f"{name}: its HTTP method and path could not be read from the SDK")
            continue
        verb, path = found.group(1).lower(), found.group(2).replace("{event_type_name}", "{name}")
        if verb not in document["paths"].get(path, {}):
            problems.append(f"{name}: {verb.upper()} {path} is not in the document")
            continue
        known = declared(path, verb)
        for parameter in inspect.signature(method).parameters.values():
            kind = parameter.annotation
            if isinstance(kind, str):  # `t.Optional[X]` as text: find X in the method's module
                kind = getattr(sys.modules[method.__module__], re.sub(r"^t\.Optional\[(.*)\]$", r"\1", kind), kind)
            if inspect.isclass(kind) and dataclasses.is_dataclass(kind):
                source = inspect.getsource(kind)
                for where, function in (("query", "_query_params"), ("header", "_header_params")):
                    block = re.search(rf"def {function}\(.*?\{{(.*?)\}}", source, re.S)
                    for key in re.findall(r'"([^"]+)":', block.group(1) if block else ""):
                        if (where, key) not in known:
                            problems.append(f"{name}: the {where} parameter {key} is not declared for {verb.upper()} {path}")
            elif inspect.isclass(kind) and issubclass(kind, pydantic.BaseModel):
                schema = schemas.get(DOCUMENT_SCHEMA.get(kind.__name__, kind.__name__))
                if schema is None:
                    problems.append(f"{name}: the document has no schema for the SDK's {kind.__name__}")
                    continue
                properties = schema.get("properties", {})
                for field, info in kind.model_fields.items():
                    key = json_key(field, info)
                    if key not in properties:
                        problems.append(f"{name}: {kind.__name__}.{key} is not in the document")
                    elif not info.is_required() and (kind.__name__, key) not in NEVER_NULL and not nullable(properties[key]):
                        problems.append(f"{name}: {kind.__name__}.{key} may be sent as null, which the document refuses")
    return problems


def main() -> None:
    url, token = os.environ["HERALD_URL"], os.environ["HERALD_TOKEN"]
    suite = Suite(url, token)
    operations = discover(suite.client)
    receiver = Receiver()
    current = ["setup"]

    def step(name: str) -> None:
        current[0] = name
        print(f"compat: {name}", file=sys.stderr, flush=True)

    try:
        scenario(suite, receiver, step)
    except Exception as exc:
        if os.environ.get("COMPAT_DEBUG"):
            traceback.print_exc()
        suite.failures.append(f"step '{current[0]}': {describe(exc) if not isinstance(exc, Mismatch) else exc}")

    unsupported = sorted(n for n in operations if not_offered(n))
    for name in unsupported:
        if name in suite.called:
            suite.failures.append(f"{name} is listed as not offered but the scenario calls it")
            continue
        try:
            check_not_offered(suite, name)
        except Mismatch as exc:
            suite.failures.append(str(exc))
    suite.failures.extend(check_document(operations))
    if not suite.failures:
        unknown = sorted(n for n in operations if n not in suite.called and not not_offered(n))
        suite.failures.extend(
            f"{name}: an operation of svix {svix.__version__} the suite does not know (add it to the scenario "
            "or to NOT_OFFERED)"
            for name in unknown
        )
        # Each operation with a request body must have taken it with every optional field null once, so a
        # field a newer pinned SDK adds is sent as null too.
        suite.failures.extend(
            f"{name}: never called with every optional field of {model.__name__} None (add a `mk_null` call)"
            for name, method in sorted(operations.items())
            if name in suite.called and name not in suite.sent_nulls
            for model in body_models(method)
            if null_fields(model)
        )

    for failure in suite.failures:
        print(f"COMPAT FAILURE svix-python {svix.__version__}: {failure}", flush=True)
        print(f"COMPAT FAILURE svix-python {svix.__version__}: {failure}", file=sys.stderr, flush=True)
    if suite.failures:
        sys.exit(1)
    supported = len(operations) - len(unsupported)
    print(
        f"COMPAT OK svix-python {svix.__version__}: {len(operations)} operations "
        f"({supported} supported, {len(unsupported)} not offered)",
        flush=True,
    )


if __name__ == "__main__":
    main()
