"""The HTTP parts of a generated request to a head or node route: path parameters, queries,
the Authorization header and others, JSON and msgpack bodies, and whether a request could stop
or change the cluster if it carried the right token."""

from __future__ import annotations

import base64
import json
import posixpath
import random
import re
import urllib.parse
from typing import Any

from burla.errors import SettingsError
from burla.head.machines.cluster_settings import ClusterSettings
from burla.protocol import wire
from burla.web.scoped_tokens import job_token, node_token
from tests.security.fuzz.model import Context, Route
from tests.security.fuzz.values import MAX_STRING, UNICODE, message, mutate, random_text, wild_value

SAFE_METHODS = (b"GET", b"HEAD", b"OPTIONS")
METHODS = (b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD")
QUERY_NAMES = ("limit", "offset", "status", "search", "next", "failed_only", "parent", "code")
ABSENT_JOB = "nojob-"  # ids the fuzzer cancels with the right token start so; no job ever has one
_ABSENT_CANCEL = re.compile(rb"/v1/jobs/nojob-[0-9a-f]+(?:%[0-9A-Fa-f]{2}|[A-Za-z0-9_~-])*/cancel(?:\?.*)?",
                            re.DOTALL)


def quote(text: str) -> bytes:
    return urllib.parse.quote(text, safe="", errors="surrogatepass").encode()


def segment(rng: random.Random, ctx: Context, kind: str) -> bytes:
    """A path parameter: an id that exists, one that doesn't, or something that is no id at all."""
    r = rng.random()
    if kind == "index" and r < 0.5:
        return rng.choice([b"0", b"1", b"2", b"9", b"999", b"-1", b"-0", b"+1", b"1_0", b"0x1", b"1e3", b"%201",
                           b"9" * 19, str(2**64).encode(), b"9" * 40, b"%C2%B2", quote("١٢"), quote("１"),
                           quote("¹²³"), b"1.0", b"NaN"])
    if kind == "name" and r < 0.6:
        return rng.choice([b"app.js", b"style.css", b"charts.js", b"page.html", b"login.html", b"nope.js", b"..",
                           b"%2E%2E", b"..%2Fapi.py", b"%2E%2E%2Fapp.py", b"%2E%2E%2F%2E%2E%2Fsetup.cfg", b".js",
                           b"style.css%00", b"STYLE.CSS", b"a" * 300 + b".js", b"app.js%2F", b"%ED%A0%80.js"])
    if r < 0.3:
        pool = ctx.node_ids if kind == "node_id" else (ctx.live_ids[-30:] if r < 0.25 else ctx.job_ids)
        if pool:
            return quote(rng.choice(pool))
    if r < 0.45:
        return f"fuzz-{rng.getrandbits(32):08x}".encode()
    if r < 0.6:
        return quote(rng.choice(UNICODE) + str(rng.randrange(100)))
    if r < 0.72:
        return rng.choice([b"%ED%A0%80", b"%FF", b"%C3%28", b"%", b"%zz", b"%00", b"%2F", b"%2E%2E", b"..", b".",
                           b"x%ED%A0%80y", b"%F0%9F%99", b"%C0%AF"])
    if r < 0.82:
        return rng.choice([b"%C2%B2", quote("¹²³"), b"9" * 30, str(2**64).encode(), b"-1", b"-0", b"1_0",
                           b"0", b"%2B1"])
    if r < 0.9:
        return b"a" * rng.choice([201, 1000, 5000, 9000])
    if r < 0.96:
        return rng.choice([b"\xff", b"\xed\xa0\x80", "é".encode(), b"\xc3"])  # raw, not percent-encoded
    return b""


def _absent_job_segment(rng: random.Random) -> bytes:
    """A job id no job has, sometimes with something odd after it (right-token cancels only)."""
    tail = rng.choice([b"", b"", b"%ED%A0%80", b"%FF", b"%C2%B2", quote("☃"), b"-x", b"~"])
    return f"{ABSENT_JOB}{rng.getrandbits(32):08x}".encode() + tail


def _query_value(rng: random.Random, ctx: Context, name: str) -> bytes:
    r = rng.random()
    if name in ("limit", "offset") and r < 0.6:
        return rng.choice([b"0", b"1", b"50", b"200", b"1000", b"1001", b"100000", b"-1", b"-0", b"-", b"",
                           b"9" * 25, b"%C2%B2", b"1_0", b"1e3", b"0x10", b"%201", b"NaN", b"1.5", b"%ED%A0%80",
                           b"%FF", b"-" + b"9" * 18, b"+5", b"%EF%BC%95"])
    if name == "status" and r < 0.6:
        return rng.choice([b"RUNNING", b"completed", b"Failed", b"canceled", b"x", b"", b"%ED%A0%80",
                           quote("ﬁnished"), quote("runnıng")])
    if name == "next" and r < 0.7:
        return rng.choice([b"/jobs", b"/", b"/settings", b"//evil.example", b"/%09/evil", b"/%0a/evil",
                           b"https://evil.example", b"/%5Cevil", b"jobs", b"", b"/%ED%A0%80", quote("/☃"),
                           b"/" + b"a" * 5000])
    if name == "failed_only" and r < 0.6:
        return rng.choice([b"true", b"1", b"yes", b"no", b"TRUE", b"", quote("ｔｒｕｅ"), b"%FF"])
    if name == "parent" and r < 0.4 and ctx.job_ids:
        return quote(rng.choice(ctx.job_ids))
    if name == "code" and r < 0.4:
        return rng.choice([base64.urlsafe_b64encode(rng.randbytes(24)).rstrip(b"="), b"", b"%ED%A0%80",
                           b"a" * 5000, b"%FF%FE"])
    if r < 0.15:
        return rng.choice([b"%ED%A0%80", b"%FF", b"%", b"%zz", b"\xff", b"%00"])
    text = random_text(rng)
    if len(text) > 3000:
        text = text[: rng.choice([499, 500, 501, 2000])]
    return quote(text)


def query(rng: random.Random, ctx: Context, route: Route) -> bytes:
    pairs = []
    if rng.random() < 0.7:
        pairs += [(n.encode(), _query_value(rng, ctx, n)) for n in route.queries if rng.random() < 0.7]
    if rng.random() < 0.25:
        name = rng.choice(QUERY_NAMES)
        pairs.append((name.encode(), _query_value(rng, ctx, name)))
    if rng.random() < 0.05:
        pairs.append((rng.choice([b"%ED%A0%80", b"%FF", quote("ключ"), b"limit", b""]),
                      rng.choice([b"1", b"", b"%ED%A0%80"])))
    if not pairs:
        return b""
    parts = [k if rng.random() < 0.03 else k + b"=" + v for k, v in pairs]
    return b"?" + b"&".join(parts)


def request_path(rng: random.Random, ctx: Context, route: Route, right_token_cancel: bool) -> bytes:
    if route.template == "/{unknown}":
        return rng.choice([
            b"/v1/nope", b"/v1", b"/v1/", b"/v1/jobs/", b"/v1/jobs//cancel", b"/v1/nodes/", b"/static/",
            b"/" + segment(rng, ctx, "job_id"), b"/v1/jobs/" + segment(rng, ctx, "job_id") + b"/nope",
            b"/v1/stream/" + segment(rng, ctx, "job_id"), b"*", b"//", b"/%2E%2E/%2E%2E/etc/passwd",
            b"/v1/jobs/x/calls/1/output/extra", b"/health/", b"/HEALTH", b"/v1/state/x",
            b"/a" * rng.choice([10, 2000]),
        ])
    path = route.template.encode()
    for name in ("job_id", "node_id", "index", "name"):
        token = b"{" + name.encode() + b"}"
        if token in path:
            if name == "job_id" and right_token_cancel:
                value = _absent_job_segment(rng)
            else:
                value = segment(rng, ctx, name)
            path = path.replace(token, value)
    return path


def auth(rng: random.Random, ctx: Context, route: Route) -> tuple[str, bytes | None]:
    # WebSockets need the token to get past the handshake, where most of what they do happens.
    weights = [75, 7, 7, 6, 5] if route.kind == "ws" else [50, 13, 13, 12, 12]
    mode = rng.choices(["right", "wrong", "none", "non-utf8", "scoped"], weights=weights)[0]
    return mode, auth_header(rng, ctx, mode)


def auth_header(rng: random.Random, ctx: Context, mode: str) -> bytes | None:
    token = ctx.token
    if mode == "right":
        return b"Bearer " + token
    if mode == "wrong":
        return rng.choice([b"Bearer wrong", b"Bearer " + token + b"x", b"Bearer " + token[:-1], b"bearer " + token,
                           b"Basic " + base64.b64encode(b"user:" + token), b"Bearer", b"Bearer ", b"Token " + token,
                           b"Bearer " + b"A" * 5000])
    if mode == "scoped":
        return b"Bearer " + scoped_token(rng, ctx).encode("utf-8", "surrogateescape")
    if mode == "non-utf8":
        return rng.choice([b"Bearer \xff", b"Bearer \xc3\x28", b"\xff\xfe", b"Bearer " + token + b"\xff",
                           b"Bearer \xed\xa0\x80", b"Bearer \x80" + token])
    return None


def extra_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    headers = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        headers.append(rng.choice([
            (b"X-Burla-CSRF", b"1"), (b"Origin", b"http://evil.example"), (b"Origin", b"null"),
            (b"Cookie", b"burla_session=" + base64.urlsafe_b64encode(rng.randbytes(32))),
            (b"Cookie", b"burla_session=\xff\xfe"), (b"Accept", b"text/html"), (b"Accept", b"text/event-stream"),
            (b"Accept-Encoding", b"gzip, br"), (b"Range", b"bytes=0-10"), (b"Range", b"bytes=99999999-"),
            (b"Range", b"bytes=garbage"), (b"If-Modified-Since", b"garbage"),
            (b"If-Modified-Since", b"Sat, 01 Jan 2000 00:00:00 GMT"), (b"If-None-Match", b'"x"'),
            (b"Content-Type", b"application/json; charset=latin-1"), (b"Content-Type", b"multipart/form-data"),
            (b"Content-Type", b"application/x-www-form-urlencoded"), (b"Upgrade", b"websocket"),
            (b"X-Forwarded-For", b"10.0.0.1"), (b"Forwarded", b"for=\xff"), (b"Host", b"evil.example"),
            (b"Expect", b"100-continue"), (b"X-Junk", b"\xff" * 100),
        ]))
    return headers


def json_body(rng: random.Random, ctx: Context, route: Route) -> bytes:
    r = rng.random()
    if r < 0.1:
        return b""
    if r < 0.25:
        return rng.choice([b"{not json", b"{", b'"text"', b"[1, 2]", b"null", b"123", b"{}}", b'{"a": }',
                           b"\xef\xbb\xbf{}", b"   ", b'{"reason": "x"} trailing'])
    if r < 0.35:
        return rng.choice([b'{"reason": NaN}', b'{"reason": "x", "n": Infinity}', b'{"quantity": -Infinity}',
                           b'{"quantity": 1e999}', b'{"inactivity_timeout_s": NaN}', b'{"reason": 1e999}'])
    if r < 0.45:
        depth = rng.choice([33, 100, 5000, 100_000])
        return rng.choice([b"[" * depth, b'{"a": ' * depth + b"1" + b"}" * depth, b"[" * depth + b"]" * depth,
                           b'{"reason": ' + b"[" * depth + b"]" * depth + b"}"])
    if r < 0.55:
        return rng.choice([b'{"reason": "\\ud800"}', b'{"\\udfff": 1}', b'{"reason": "a\\udc80b"}', b"\xff\xfe",
                           b'{"reason": "\xc3\x28"}', b'{"reason": "\xed\xa0\x80"}', rng.randbytes(100)])
    if r < 0.65:
        key = rng.choice(["reason", "quantity", "workers_per_node", "max_gpus", "spot", "region", "a"])
        return json.dumps({key: "x" * rng.choice([2000, 2001, 10_000, MAX_STRING])}).encode()
    values = {}
    keys = ["reason", "quantity", "workers_per_node", "machine_type", "region", "disk_gb", "image",
            "inactivity_timeout_s", "spot", "max_vcpus", "max_gpus", "unknown", "ключ"]
    for _ in range(rng.choice([1, 1, 2, 3])):
        values[rng.choice(keys)] = _jsonable(wild_value(rng))
    try:
        return json.dumps(values, allow_nan=True, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError):
        return b'{"reason": "unencodable"}'


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def steal_body(rng: random.Random, job_id: str, ack: bool) -> bytes:
    if ack:
        msg = message(wire.StealAck, job_id=job_id, transfer_id=f"t-{rng.getrandbits(24):06x}",
                      grant=rng.randbytes(32))
    else:
        msg = message(wire.StealRequest, job_id=job_id, transfer_id=f"t-{rng.getrandbits(24):06x}",
                      thief_id="fuzz-thief", max_items=rng.choice([0, 1, 5, 1000]),
                      expires_at=rng.choice([0.0, 1e10, -1.0]), grant=rng.randbytes(32))
    if rng.random() < 0.1:
        return rng.choice([b"", b"{}", b'{"job_id": "x"}', b"x" * rng.choice([65_536, 65_537, MAX_STRING])])
    return mutate(rng, msg)


def _surely_invalid_settings(body: bytes | None) -> bool:
    """Whether the head would refuse this body as a settings change (no change is made)."""
    if body is None or not body.strip():
        return False  # an empty body is {}, a valid (empty) change
    try:
        value = json.loads(body.decode("utf-8"))  # laxer than the head, which also refuses NaN
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    if not isinstance(value, dict):
        return True
    try:
        ClusterSettings().updated(value)
    except SettingsError:
        return True
    except Exception:  # the head would fail the same way, before changing anything
        return True
    return False


def _decodings(target: bytes) -> set[str]:
    """How a server might read the path and query of this request target."""
    out = set()
    texts = [target]
    if not target.startswith(b"/"):
        texts.append(urllib.parse.urlsplit(target).path)
    for raw in texts:
        once = urllib.parse.unquote_to_bytes(raw)
        for candidate in (raw, once, urllib.parse.unquote_to_bytes(once)):
            text = candidate.decode("utf-8", "surrogateescape")
            path = text.split("?", 1)[0]
            out.update({text, posixpath.normpath(re.sub("/+", "/", path) or "/")})
    return out


def right_token_is_unsafe(method: bytes, target: bytes, body: bytes | None) -> bool:
    """Whether this request could stop or change the cluster if it carried the right token."""
    if method in SAFE_METHODS:
        return False
    for text in _decodings(target):
        low = text.lower()
        if "shutdown" in low or "/cluster/" in low or low.rstrip("/").endswith(("/start", "/stop", "/restart")):
            return True
        if "settings" in low and not _surely_invalid_settings(body):
            return True
        if "cancel" in low and not _ABSENT_CANCEL.fullmatch(target):
            return True
    return False


def scoped_token(rng: random.Random, ctx: Context) -> str:
    """A job's or a node's token (burla.web.scoped_tokens), valid or mangled. Node tokens name
    made-up nodes only: a live node's own token may legitimately take its registration over."""
    token = ctx.token.decode()
    job = rng.choice(ctx.live_ids) if ctx.live_ids and rng.random() < 0.7 else f"fuzz-{rng.randrange(1000)}"
    valid = rng.choice([job_token(token, job), node_token(token, f"fuzz-node-{rng.randrange(1000)}")])
    prefix, subject, mac = valid.split(".")
    return rng.choice([
        valid, valid, valid + "=", valid[:-1], f"{prefix}.{subject}", f"bnt1.{subject}.{mac}", f"bjt1.{subject}.{mac}",
        job_token("another-cluster", job), f"{prefix}.{subject}\udcff.{mac}", f"{prefix}..{mac}",
        f"{prefix}.{'A' * 3000}.{mac}", f"{prefix}.{subject}.{mac}.{mac}",
    ])
