"""Schemathesis hooks for scripts/schemathesis.

Each hook below says which rule of the API the document can state only in words and how a generated case
is made to follow it; the first is the idempotency key's.

An idempotency key names one request: a key reused with another body, path or query is refused with a
422 by design (docs/svix-compatibility.md; the IETF Idempotency-Key draft says the same). The document
can say what a key looks like, not that a client must not reuse one, so generated cases would reuse the
few keys Hypothesis draws across different requests. Each request that carries a well-formed key gets a
fresh one here, as a real client's would be; a malformed key (a negative case) is sent as generated.
"""

import base64
import datetime
import itertools
import re

import schemathesis
from hypothesis import strategies as st

_KEY = re.compile(r"[\x21-\x7e]{1,256}")
_counter = itertools.count()


@schemathesis.hook
def before_call(context, case, kwargs):
    # A negative case is left as generated: it must be refused anyway, and editing it would make
    # Schemathesis re-classify it (and, for a case that leaves out `Authorization`, send the token again).
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return
    # `DELETE /event-type/{name}` archives by default, as Svix's does: the type can still be read and changed,
    # which the stateful phase's use-after-free check reads as a bug (`--checks all` keeps that check on for
    # every operation, whatever the settings file says). In that phase the delete is sent with `expunge=true`,
    # which removes the type, so what follows it is checked against a real deletion.
    if (
        case.meta is not None
        and case.meta.phase.name == "stateful"
        and case.method.upper() == "DELETE"
        and case.operation.path == "/api/v1/event-type/{name}"
    ):
        case.query = {**(case.query or {}), "expunge": "true"}
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "idempotency-key" and isinstance(headers[name], str) and _KEY.fullmatch(headers[name]):
            headers[name] = f"st-{next(_counter)}"
    # With a `secret`, `signatureType` must name its kind (a rule between two fields, which the document
    # states in words only): a valid case gets the kind of the key it was generated with.
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("secret"), str) and body.get("signatureType") is not None:
        body["signatureType"] = "ed25519" if body["secret"].strip().startswith("whsk_") else "hmac"
    # A PUT that creates the application or endpoint makes the path segment its uid, so a `uid` in the body
    # must be that segment (a rule between the path and the body, stated in words only): a valid case
    # whose segment is a uid sends it. (A segment shaped like an id names an existing object, whose uid
    # the body may change, or none, a 404.)
    put = _PUT_CREATES.get(case.operation.path) if case.method.upper() == "PUT" else None
    if put and isinstance(body, dict) and body.get("uid") is not None and case.path_parameters:
        parameter, id_prefix = put
        segment = case.path_parameters.get(parameter)
        if isinstance(segment, str) and not segment.startswith(id_prefix):
            body["uid"] = segment


# The path parameter a `PUT` turns into the uid of the object it creates, and its ids' prefix, by path.
_PUT_CREATES = {
    "/api/v1/app/{app_id}": ("app_id", "app_"),
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}": ("endpoint_id", "ep_"),
}


# Signing keys (`format: herald-signing-key`): the document's pattern says what a key looks like, but an
# Ed25519 (`whsk_`) key is also a pair whose public half must be its seed's, which no pattern can state.
# Keys generated for valid cases are HMAC keys of 24 to 64 random bytes, written every way the server
# reads them (with and without `whsec_`, padded and not); invalid cases still come from the pattern.
def _hmac_key(parts):
    prefixed, key, padded = parts
    text = base64.b64encode(key).decode()
    return ("whsec_" if prefixed else "") + (text if padded else text.rstrip("="))


schemathesis.openapi.format(
    "herald-signing-key",
    st.tuples(st.booleans(), st.binary(min_size=24, max_size=64), st.booleans()).map(_hmac_key),
)


# Scheduled delivery (`format: herald-deliver-at`): a date-time at most 24 hours ahead of the server's
# clock, which a schema cannot state (it has no "now"). Valid cases get times from two days back (a past
# time delivers at once) to 23 hours ahead, drawn as an offset from the moment the case is generated; the
# hour of margin outlasts the run.
def _deliver_at(offset_seconds):
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


schemathesis.openapi.format(
    "herald-deliver-at",
    st.integers(min_value=-2 * 86_400, max_value=23 * 3_600).map(_deliver_at),
)
