"""A deterministic fuzzer for every route of a running head and one of its nodes.

`run(head, node_url, random.Random(seed), requests)` sends `requests` malformed or random
requests spread over every HTTP route of the head (JSON API, pages, login, static files, the
event streams), every route of the node, and the head's two WebSockets, and returns a
`Summary`: how each route answered (by status class) and the findings.

Requests are generated one after another from the seeded generator (the same seed gives the
same requests) and sent a few at a time over raw sockets, so that any byte can go out: paths
and header values that aren't UTF-8, bodies that aren't JSON, frames that aren't msgpack or not
even WebSocket. Each request carries, at random, the right bearer token, a wrong one, none, or
an Authorization header that isn't UTF-8.

A finding is an answer no client input should cause: a 5xx, a connection the server dropped
without answering, a WebSocket it closed with 1011 (or 1006, or without a close frame), an
ErrorReply carrying a 5xx, or no answer within 30 s.

What never goes out with the right token, because it would legitimately stop or change the
cluster: a POST to /v1/shutdown or /v1/cluster/start|stop|restart, a settings change the head
would accept, a cancel of a job that may exist, or a job whose packages a node would install.
Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import math
import pickle
import posixpath
import random
import re
import struct
import sys
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from burla import wire
from burla._version import __version__
from burla.build import build_hash
from burla.head.fleet import ClusterSettings, SettingsError
from burla.validation import packages_problem

TIMEOUT_S = 30.0  # per request or WebSocket session
CONCURRENCY = 8
STREAM_READ_S = 2.0  # how long an event stream is read before it is closed
MAX_STRING = 100 * 1024
MAX_INPUTS_OF_A_FUZZ_JOB = 1000  # jobs the fuzzer opens stay small: the head keeps state per input
SAFE_METHODS = (b"GET", b"HEAD", b"OPTIONS")
METHODS = (b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"HEAD")
QUERY_NAMES = ("limit", "offset", "status", "search", "next", "failed_only", "parent", "code")
PYTHON = "{}.{}.{}".format(*sys.version_info[:3])
BUILD = build_hash()
PICKLED_ABS = pickle.dumps(abs)
ABSENT_JOB = "nojob-"  # ids the fuzzer cancels with the right token start so; no job ever has one
_ABSENT_CANCEL = re.compile(rb"/v1/jobs/nojob-[0-9a-f]+(?:%[0-9A-Fa-f]{2}|[A-Za-z0-9_~-])*/cancel(?:\?.*)?",
                            re.DOTALL)

# --- results -------------------------------------------------------------------------------


@dataclass
class Finding:
    """One request whose answer no input should cause."""

    index: int  # its place in the generated sequence
    route: str
    method: str
    path: str
    headers: dict[str, str]
    body_prefix: str
    status: str  # "500", "reset", "timeout", "ws close 1011", "ws ErrorReply 503"...
    detail: str = ""

    def __str__(self) -> str:
        return (f"#{self.index} {self.route}: {self.status}{f' ({self.detail})' if self.detail else ''}\n"
                f"    {self.method} {self.path}\n    headers {self.headers}\n    body {self.body_prefix}")


@dataclass
class Summary:
    requests: int = 0
    seconds: float = 0.0
    counts: dict[str, collections.Counter] = field(default_factory=dict)  # route -> status class -> n
    ws_close_codes: collections.Counter = field(default_factory=collections.Counter)
    ws_replies: collections.Counter = field(default_factory=collections.Counter)  # what the head sent back
    findings: list[Finding] = field(default_factory=list)

    def by_class(self) -> dict[str, int]:
        total: collections.Counter = collections.Counter()
        for counter in self.counts.values():
            total.update(counter)
        return dict(sorted(total.items()))

    def distinct_findings(self) -> dict[tuple[str, str], list[Finding]]:
        groups: dict[tuple[str, str], list[Finding]] = {}
        for finding in self.findings:
            groups.setdefault((finding.route, finding.status), []).append(finding)
        return groups

    def report(self) -> str:
        lines = [f"{self.requests} requests in {self.seconds:.1f} s; by class {self.by_class()}; "
                 f"WebSocket close codes {dict(sorted(self.ws_close_codes.items()))}",
                 f"WebSocket replies {dict(self.ws_replies.most_common())}"]
        for route in sorted(self.counts):
            lines.append(f"  {route:52} {dict(sorted(self.counts[route].items()))}")
        lines.append(f"{len(self.findings)} finding(s), {len(self.distinct_findings())} distinct (route, status)")
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)


@dataclass
class Outcome:
    status: str  # a status class ("2xx"), "reset", "timeout"
    finding: str | None = None  # why this answer is a finding
    detail: str = ""
    close_code: int | None = None
    replies: collections.Counter | None = None


# --- routes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    base: str  # "head" or "node"
    method: bytes
    template: str
    kind: str = "http"  # http, sse, ws
    body: str | None = None  # json, steal, ack
    queries: tuple[str, ...] = ()
    weight: int = 1

    @property
    def name(self) -> str:
        return f"{self.base} {self.method.decode()} {self.template}"


ROUTES = (
    Route("head", b"GET", "/health"),
    Route("head", b"POST", "/v1/shutdown"),
    Route("head", b"GET", "/v1/cluster"),
    Route("head", b"GET", "/v1/jobs", queries=("status", "limit", "parent")),
    Route("head", b"GET", "/v1/jobs/{job_id}"),
    Route("head", b"POST", "/v1/jobs/{job_id}/cancel", body="json"),
    Route("head", b"GET", "/v1/jobs/{job_id}/failures", queries=("limit",)),
    Route("head", b"GET", "/v1/jobs/{job_id}/calls/{index}/output"),
    Route("head", b"GET", "/v1/nodes/{node_id}/events"),
    Route("head", b"GET", "/v1/nodes/{node_id}"),
    Route("head", b"GET", "/v1/jobs/{job_id}/metrics"),
    Route("head", b"GET", "/v1/jobs/{job_id}/output", queries=("search", "limit")),
    Route("head", b"GET", "/v1/jobs/{job_id}/calls", queries=("failed_only", "offset", "limit")),
    Route("head", b"GET", "/v1/settings"),
    Route("head", b"POST", "/v1/settings", body="json"),
    Route("head", b"POST", "/v1/cluster/start"),
    Route("head", b"POST", "/v1/cluster/stop"),
    Route("head", b"POST", "/v1/cluster/restart"),
    Route("head", b"GET", "/"),
    Route("head", b"GET", "/jobs"),
    Route("head", b"GET", "/jobs/{job_id}"),
    Route("head", b"GET", "/settings"),
    Route("head", b"GET", "/login", queries=("code", "next")),
    Route("head", b"GET", "/static/{name}", weight=2),
    Route("head", b"POST", "/v1/login-link", queries=("next",)),
    Route("head", b"GET", "/v1/stream/cluster", kind="sse"),
    Route("head", b"GET", "/v1/stream/jobs", kind="sse", queries=("limit",)),
    Route("head", b"GET", "/v1/stream/jobs/{job_id}", kind="sse"),
    Route("head", b"GET", "/v1/jobs/ws", kind="ws", weight=4),
    Route("head", b"GET", "/v1/nodes/ws", kind="ws", weight=4),
    Route("head", b"GET", "/{unknown}"),
    Route("node", b"GET", "/health"),
    Route("node", b"GET", "/v1/state"),
    Route("node", b"POST", "/v1/jobs/{job_id}/steal", body="steal", weight=2),
    Route("node", b"POST", "/v1/jobs/{job_id}/steal/ack", body="ack", weight=2),
    Route("node", b"GET", "/{unknown}"),
)


@dataclass
class Context:
    """What the generator knows about the cluster: ids worth aiming at."""

    token: bytes
    head: tuple[str, int]
    node: tuple[str, int]
    node_ids: list[str]
    job_ids: list[str]  # every id the fuzzer opened a job with, and jobs that existed before
    live_ids: list[str]  # the ids of jobs that exist: opened well-formed with the token, or there before


@dataclass
class Plan:
    """One generated request (or WebSocket session), ready to send."""

    index: int
    route: Route
    address: tuple[str, int]
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes | None = None
    chunked: bool = False
    frames: list[tuple[bytes, bool, str]] = field(default_factory=list)  # (wire bytes, ends the stream, what)
    drop: bool = False  # end a WebSocket by dropping the connection, not with a close frame
    linger: float = 0.0  # seconds a WebSocket stays open after its frames (results come back meanwhile)


# --- values --------------------------------------------------------------------------------

UNICODE = ["jöb", "☃", "日本語", "🙂", "\u202eevil", "a\u200bb", "Ω≈ç√", "\x00", "tab\there", "new\nline", "ﬁ", "İ"]
SURROGATES = ["\ud800", "\udfff", "a\ud800b", "\udc80\udc80"]
WILD_INTS = [0, 1, -1, 2, 3, 7, 2**31, -(2**31), 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, wire.MAX_INPUTS + 1]
WILD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.5, -1.5]


def _text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return rng.choice(UNICODE) * rng.choice([1, 2, 20])
    if r < 0.45:
        return rng.choice(SURROGATES)
    if r < 0.55:
        return "x" * rng.choice([300, 5000, MAX_STRING])
    if r < 0.65:
        return rng.choice(["", " ", "-x", "../../etc/passwd", "' OR 1=1 --", "%", "%%", "_", "\\", "null", "NaN"])
    return "".join(rng.choice("abcXYZ019_.-") for _ in range(rng.randint(1, 24)))


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _wild(rng: random.Random) -> Any:
    """A value of a random type, often an edge of its type."""
    r = rng.random()
    if r < 0.22:
        return rng.choice(WILD_INTS)
    if r < 0.34:
        return rng.choice(WILD_FLOATS)
    if r < 0.56:
        return _text(rng)
    if r < 0.66:
        return rng.choice([b"", b"\x00", b"\xff" * 10, b"\x80\x05N.", rng.randbytes(rng.choice([1, 64, 4096]))])
    if r < 0.72:
        return rng.choice([None, True, False])
    if r < 0.86:
        return rng.choice([[], [[]], [1, "a"], [[0, b"x"]], [[0, True, b"x"]], [[0, 1, "t"]], ["j", 1, 2, 3],
                           list(range(rng.choice([100, 5000])))])
    if r < 0.95:
        return rng.choice([{}, {"a": 1}, {1: 2}, {b"k": b"v"}, {"numpy": 1}, {"../x": "1.0"}, {"": ""}])
    return _nested(rng.choice([10, 40, 200]))


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, unicode_errors="surrogatepass")


_DEFAULTS = {"int": 0, "float": 0.0, "bool": False, "str": "", "bytes": b"", "list": [], "dict": {}}


def _message(cls: type[wire.Message], **values: Any) -> list:
    """A message as the list its frame holds, `[TAG, field...]`: the values given, and for any
    other field (the protocol grows) the empty value of its type."""
    fields = []
    for name in cls._fields:
        if name in values:
            fields.append(values[name])
            continue
        annotation = cls.__annotations__.get(name, "None")
        kinds = [part.strip().split("[", 1)[0] for part in str(annotation).split("|")]
        fields.append(None if "None" in kinds else _DEFAULTS.get(kinds[0]))
    return [cls.TAG, *fields]


def _mutate(rng: random.Random, msg: list) -> bytes:
    """A frame from a well-formed message, most often with something wrong in it."""
    r = rng.random()
    msg = list(msg)
    if r < 0.12:
        pass  # as is
    elif r < 0.6:
        for _ in range(rng.choice([1, 1, 2, 3])):
            if len(msg) > 1:
                msg[rng.randrange(1, len(msg))] = _wild(rng)
    elif r < 0.65:
        msg = msg[:-1] if rng.random() < 0.5 else [*msg, _wild(rng)]
    elif r < 0.7:
        msg[0] = rng.choice([0, -1, 19, 43, 99, 2**32, 2**64 - 1, "1", 1.0, None, *wire._REGISTRY])
    elif r < 0.74:
        return _pack(rng.choice([{msg[0]: msg[1:]}, [], "frame", 5, None, msg[1:]]))
    elif r < 0.8:
        packed = _pack(_defuse(msg))
        return packed[: rng.randrange(len(packed))]  # truncated
    elif r < 0.84:
        return _pack(_defuse(msg)) + rng.choice([b"\x00", b"\xc1", rng.randbytes(16)])  # trailing bytes
    elif r < 0.88:
        depth = rng.choice([100, 1000, 100_000])
        return rng.choice([b"\x91" * depth + b"\xc0", b"\x92\x01" + b"\x91" * depth + b"\xc0"])
    elif r < 0.92:
        return rng.randbytes(rng.choice([0, 1, 7, 100, 5000]))
    elif r < 0.96:
        return rng.choice([
            b"\x81\x90\x01",  # a map whose key is an array
            b"\x92\x01\xd4\x05\x00",  # an ext type
            b"\x92\x01\xd6\xff\x00\x00\x00\x01",  # a timestamp
            b"\xdd\xff\xff\xff\xff",  # an array that claims 4 billion items
            b"\xdb\x7f\xff\xff\xff",  # a str that claims 2 GB
            b"\xc1",  # never used
        ])
    else:
        if len(msg) > 1:
            msg[rng.randrange(1, len(msg))] = rng.choice(SURROGATES)
    return _pack(_defuse(msg))


def _defuse(msg: list) -> list:
    """Nothing a frame asks for may leave loopback or take the head's memory: no package a node
    would install, no job of millions of inputs, no node URL beyond loopback."""
    if not msg:
        return msg
    if msg[0] == wire.OpenJob.TAG and len(msg) == len(wire.OpenJob._fields) + 1:
        packages = msg[_slot(wire.OpenJob, "packages")]
        if isinstance(packages, dict) and packages and packages_problem(packages) is None:
            msg[_slot(wire.OpenJob, "packages")] = {}
        n_inputs = msg[_slot(wire.OpenJob, "n_inputs")]
        if type(n_inputs) is int and MAX_INPUTS_OF_A_FUZZ_JOB < n_inputs <= wire.MAX_INPUTS:
            msg[_slot(wire.OpenJob, "n_inputs")] = MAX_INPUTS_OF_A_FUZZ_JOB
    url = _slot(wire.RegisterNode, "url")
    if msg[0] == wire.RegisterNode.TAG and len(msg) > url and isinstance(msg[url], str) and "://" in msg[url]:
        msg[url] = "http://127.0.0.1:9"  # the URL other nodes steal from: loopback, where nothing listens
    return msg


def _slot(cls: type[wire.Message], name: str) -> int:
    """Where a field sits in a message's frame list (after the tag)."""
    return cls._fields.index(name) + 1


# --- paths, queries, headers, bodies -------------------------------------------------------


def _quote(text: str) -> bytes:
    return urllib.parse.quote(text, safe="", errors="surrogatepass").encode()


def _segment(rng: random.Random, ctx: Context, kind: str) -> bytes:
    """A path parameter: an id that exists, one that doesn't, or something that is no id at all."""
    r = rng.random()
    if kind == "index" and r < 0.5:
        return rng.choice([b"0", b"1", b"2", b"9", b"999", b"-1", b"-0", b"+1", b"1_0", b"0x1", b"1e3", b"%201",
                           b"9" * 19, str(2**64).encode(), b"9" * 40, b"%C2%B2", _quote("١٢"), _quote("１"),
                           _quote("¹²³"), b"1.0", b"NaN"])
    if kind == "name" and r < 0.6:
        return rng.choice([b"app.js", b"style.css", b"charts.js", b"page.html", b"login.html", b"nope.js", b"..",
                           b"%2E%2E", b"..%2Fapi.py", b"%2E%2E%2Fapp.py", b"%2E%2E%2F%2E%2E%2Fsetup.cfg", b".js",
                           b"style.css%00", b"STYLE.CSS", b"a" * 300 + b".js", b"app.js%2F", b"%ED%A0%80.js"])
    if r < 0.3:
        pool = ctx.node_ids if kind == "node_id" else (ctx.live_ids[-30:] if r < 0.25 else ctx.job_ids)
        if pool:
            return _quote(rng.choice(pool))
    if r < 0.45:
        return f"fuzz-{rng.getrandbits(32):08x}".encode()
    if r < 0.6:
        return _quote(rng.choice(UNICODE) + str(rng.randrange(100)))
    if r < 0.72:
        return rng.choice([b"%ED%A0%80", b"%FF", b"%C3%28", b"%", b"%zz", b"%00", b"%2F", b"%2E%2E", b"..", b".",
                           b"x%ED%A0%80y", b"%F0%9F%99", b"%C0%AF"])
    if r < 0.82:
        return rng.choice([b"%C2%B2", _quote("¹²³"), b"9" * 30, str(2**64).encode(), b"-1", b"-0", b"1_0",
                           b"0", b"%2B1"])
    if r < 0.9:
        return b"a" * rng.choice([201, 1000, 5000, 9000])
    if r < 0.96:
        return rng.choice([b"\xff", b"\xed\xa0\x80", "é".encode(), b"\xc3"])  # raw, not percent-encoded
    return b""


def _absent_job_segment(rng: random.Random) -> bytes:
    """A job id no job has, sometimes with something odd after it (right-token cancels only)."""
    tail = rng.choice([b"", b"", b"%ED%A0%80", b"%FF", b"%C2%B2", _quote("☃"), b"-x", b"~"])
    return f"{ABSENT_JOB}{rng.getrandbits(32):08x}".encode() + tail


def _query_value(rng: random.Random, ctx: Context, name: str) -> bytes:
    r = rng.random()
    if name in ("limit", "offset") and r < 0.6:
        return rng.choice([b"0", b"1", b"50", b"200", b"1000", b"1001", b"100000", b"-1", b"-0", b"-", b"",
                           b"9" * 25, b"%C2%B2", b"1_0", b"1e3", b"0x10", b"%201", b"NaN", b"1.5", b"%ED%A0%80",
                           b"%FF", b"-" + b"9" * 18, b"+5", b"%EF%BC%95"])
    if name == "status" and r < 0.6:
        return rng.choice([b"RUNNING", b"completed", b"Failed", b"canceled", b"x", b"", b"%ED%A0%80",
                           _quote("ﬁnished"), _quote("runnıng")])
    if name == "next" and r < 0.7:
        return rng.choice([b"/jobs", b"/", b"/settings", b"//evil.example", b"/%09/evil", b"/%0a/evil",
                           b"https://evil.example", b"/%5Cevil", b"jobs", b"", b"/%ED%A0%80", _quote("/☃"),
                           b"/" + b"a" * 5000])
    if name == "failed_only" and r < 0.6:
        return rng.choice([b"true", b"1", b"yes", b"no", b"TRUE", b"", _quote("ｔｒｕｅ"), b"%FF"])
    if name == "parent" and r < 0.4 and ctx.job_ids:
        return _quote(rng.choice(ctx.job_ids))
    if name == "code" and r < 0.4:
        return rng.choice([base64.urlsafe_b64encode(rng.randbytes(24)).rstrip(b"="), b"", b"%ED%A0%80",
                           b"a" * 5000, b"%FF%FE"])
    if r < 0.15:
        return rng.choice([b"%ED%A0%80", b"%FF", b"%", b"%zz", b"\xff", b"%00"])
    text = _text(rng)
    if len(text) > 3000:
        text = text[: rng.choice([499, 500, 501, 2000])]
    return _quote(text)


def _query(rng: random.Random, ctx: Context, route: Route) -> bytes:
    pairs = []
    if rng.random() < 0.7:
        pairs += [(n.encode(), _query_value(rng, ctx, n)) for n in route.queries if rng.random() < 0.7]
    if rng.random() < 0.25:
        name = rng.choice(QUERY_NAMES)
        pairs.append((name.encode(), _query_value(rng, ctx, name)))
    if rng.random() < 0.05:
        pairs.append((rng.choice([b"%ED%A0%80", b"%FF", _quote("ключ"), b"limit", b""]),
                      rng.choice([b"1", b"", b"%ED%A0%80"])))
    if not pairs:
        return b""
    parts = [k if rng.random() < 0.03 else k + b"=" + v for k, v in pairs]
    return b"?" + b"&".join(parts)


def _path(rng: random.Random, ctx: Context, route: Route, right_token_cancel: bool) -> bytes:
    if route.template == "/{unknown}":
        return rng.choice([
            b"/v1/nope", b"/v1", b"/v1/", b"/v1/jobs/", b"/v1/jobs//cancel", b"/v1/nodes/", b"/static/",
            b"/" + _segment(rng, ctx, "job_id"), b"/v1/jobs/" + _segment(rng, ctx, "job_id") + b"/nope",
            b"/v1/stream/" + _segment(rng, ctx, "job_id"), b"*", b"//", b"/%2E%2E/%2E%2E/etc/passwd",
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
                value = _segment(rng, ctx, name)
            path = path.replace(token, value)
    return path


def _auth(rng: random.Random, ctx: Context, route: Route) -> tuple[str, bytes | None]:
    # WebSockets need the token to get past the handshake, where most of what they do happens.
    weights = [80, 7, 7, 6] if route.kind == "ws" else [55, 15, 15, 15]
    mode = rng.choices(["right", "wrong", "none", "non-utf8"], weights=weights)[0]
    return mode, _auth_header(rng, ctx, mode)


def _auth_header(rng: random.Random, ctx: Context, mode: str) -> bytes | None:
    token = ctx.token
    if mode == "right":
        return b"Bearer " + token
    if mode == "wrong":
        return rng.choice([b"Bearer wrong", b"Bearer " + token + b"x", b"Bearer " + token[:-1], b"bearer " + token,
                           b"Basic " + base64.b64encode(b"user:" + token), b"Bearer", b"Bearer ", b"Token " + token,
                           b"Bearer " + b"A" * 5000])
    if mode == "non-utf8":
        return rng.choice([b"Bearer \xff", b"Bearer \xc3\x28", b"\xff\xfe", b"Bearer " + token + b"\xff",
                           b"Bearer \xed\xa0\x80", b"Bearer \x80" + token])
    return None


def _extra_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
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


def _json_body(rng: random.Random, ctx: Context, route: Route) -> bytes:
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
        values[rng.choice(keys)] = _jsonable(_wild(rng))
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


def _steal_body(rng: random.Random, job_id: str, ack: bool) -> bytes:
    if ack:
        msg = _message(wire.StealAck, job_id=job_id, transfer_id=f"t-{rng.getrandbits(24):06x}",
                       grant=rng.randbytes(32))
    else:
        msg = _message(wire.StealRequest, job_id=job_id, transfer_id=f"t-{rng.getrandbits(24):06x}",
                       thief_id="fuzz-thief", max_items=rng.choice([0, 1, 5, 1000]),
                       expires_at=rng.choice([0.0, 1e10, -1.0]), grant=rng.randbytes(32))
    if rng.random() < 0.1:
        return rng.choice([b"", b"{}", b'{"job_id": "x"}', b"x" * rng.choice([65_536, 65_537, MAX_STRING])])
    return _mutate(rng, msg)


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


def _right_token_is_unsafe(method: bytes, target: bytes, body: bytes | None) -> bool:
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


# --- WebSocket plans -----------------------------------------------------------------------


def _ws_frame(rng: random.Random, opcode: int, payload: bytes, fin: bool = True, masked: bool = True,
              rsv: int = 0) -> bytes:
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    length = n if n < 126 else (126 if n < 65536 else 127)
    head += bytes([(0x80 if masked else 0) | length])
    if length == 126:
        head += struct.pack("!H", n)
    elif length == 127:
        head += struct.pack("!Q", n)
    if not masked:
        return head + payload
    key = rng.randbytes(4)
    if n:
        stream = (key * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
    return head + key + payload


def _describe(payload: bytes) -> str:
    return repr(payload[:120]) + (f"... ({len(payload)} bytes)" if len(payload) > 120 else "")


def _wrap(rng: random.Random, payload: bytes) -> tuple[bytes, bool, str]:
    """A WebSocket frame around a message: mostly a plain binary frame, sometimes not."""
    r = rng.random()
    if r < 0.85:
        return _ws_frame(rng, 2, payload), False, f"binary {_describe(payload)}"
    if r < 0.89:
        text = rng.choice([payload.decode("utf-8", "replace").encode(), b"hello", b"\xff\xfe", b"{}"])
        return _ws_frame(rng, 1, text), False, f"text {_describe(text)}"
    if r < 0.92 and len(payload) > 1:
        cut = rng.randrange(1, len(payload))
        return (_ws_frame(rng, 2, payload[:cut], fin=False) + _ws_frame(rng, 0, payload[cut:]), False,
                f"fragmented {_describe(payload)}")
    if r < 0.94:
        frame = _ws_frame(rng, 2, payload)
        return frame[: rng.randrange(1, len(frame))], True, f"cut-off frame of {_describe(payload)}"
    if r < 0.96:
        return _ws_frame(rng, 2, payload, masked=False), False, f"unmasked {_describe(payload)}"
    if r < 0.97:
        return _ws_frame(rng, 2, payload, rsv=rng.choice([1, 2, 4])), False, f"reserved bits {_describe(payload)}"
    if r < 0.98:
        return _ws_frame(rng, rng.choice([3, 7, 11, 15]), payload), False, f"unknown opcode {_describe(payload)}"
    if r < 0.99:
        ping = rng.choice([b"", b"p", b"x" * 200])
        return _ws_frame(rng, 9, ping), False, f"ping of {len(ping)} bytes"
    return _ws_frame(rng, 0, payload), False, f"continuation without start {_describe(payload)}"


def _open_job(rng: random.Random, ctx: Context) -> list:
    job_id = f"fuzzjob-{rng.getrandbits(40):010x}"
    ctx.job_ids.append(job_id)
    function_bytes = rng.choice([PICKLED_ABS, PICKLED_ABS, b"x", pickle.dumps(5), b"\x80\x05", b""])
    return _message(
        wire.OpenJob, job_id=job_id, function_name="fuzz", function_bytes=function_bytes,
        n_inputs=rng.choice([1, 2, 3, 5, 10]), func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False,
        max_parallelism=None, detach=False, raise_errors=rng.random() < 0.5, region=None, disk_gb=None,
        parent_job_id=rng.choice([None, None, *ctx.job_ids[-3:]]), client_version=__version__,
        python_version=PYTHON, local_code=b"", packages={},
    )


def _job_follow_up(rng: random.Random, ctx: Context, job_id: str, n_inputs: int) -> list:
    r = rng.random()
    if r < 0.5:
        count = rng.choice([1, 1, 2, n_inputs])
        items = [[rng.choice([i, i, -1, n_inputs, 2**63 - 1]) if rng.random() < 0.1 else i,
                  rng.choice([pickle.dumps(-i), pickle.dumps(-i), b"garbage", b""])] for i in range(count)]
        return _message(wire.InputBatch, job_id=job_id, items=items)
    if r < 0.7:
        return _message(wire.ResultAck, job_id=job_id, seq=rng.choice([0, 1, 2, -1, 10**6, 2**63 - 1]))
    if r < 0.8:
        return _message(wire.CancelJob, job_id=job_id, reason=_text(rng))
    if r < 0.9:
        return _open_job(rng, ctx)
    return _message(wire.ResumeJob, job_id=job_id, acked_seq=rng.choice([0, -1, 2**63 - 1]))


def _error_record(rng: random.Random) -> bytes:
    msg = _message(wire.ErrorRecord, type_name="ValueError", module="builtins", message=_text(rng),
                   traceback=_text(rng))
    return _mutate(rng, msg) if rng.random() < 0.5 else _pack(msg)


def _node_follow_up(rng: random.Random, ctx: Context, node_id: str) -> list:
    job_id = rng.choice(ctx.live_ids[-20:]) if ctx.live_ids and rng.random() < 0.8 else f"fuzz-{rng.getrandbits(16)}"
    index = rng.choice([0, 1, 2, -1, 10**9, 2**63 - 1])
    r = rng.random()
    if r < 0.25:
        jobs = [[job_id, rng.choice([0, 1, -1]), rng.choice([0, 5, 2**63 - 1]), rng.choice([0, 1])]]
        return _message(wire.NodeState, node_id=node_id, status=rng.choice(["READY", "RUNNING", "x"]),
                        workers_alive=rng.choice([0, 1, 2]), jobs=rng.choice([[], jobs]), cpu_percent=12.5,
                        mem_percent=40.0, net_sent_bps=0.0, net_recv_bps=1e6)
    if r < 0.5:
        ok = rng.random() < 0.5
        payload = pickle.dumps(index) if ok else _error_record(rng)
        return _message(wire.ResultBatch, job_id=job_id, seq=rng.choice([0, 1, 2**63 - 1]),
                        items=[[index, ok, payload]])
    if r < 0.62:
        return _message(wire.OutputBatch, job_id=job_id, items=[[index, rng.choice([1, 2, 0, 3]), _text(rng)]])
    if r < 0.74:
        return _message(wire.Credit, job_id=job_id, inputs=rng.choice([0, 1, 100, -1, 2**63 - 1]),
                        bytes=rng.choice([0, 2**20, -1]))
    if r < 0.86:
        donor = rng.choice([*ctx.node_ids, node_id, "fuzz-donor"]) if ctx.node_ids else node_id
        return _message(wire.Stolen, job_id=job_id, donor_id=donor, indices=[index, index])
    if r < 0.93:
        return _message(wire.NodeLeaving, reason=_text(rng))
    return _register(rng)


def _register(rng: random.Random) -> list:
    node_id = f"fuzznode-{rng.getrandbits(32):08x}"
    return _message(wire.RegisterNode, node_id=node_id, url="http://127.0.0.1:9", slots=rng.choice([1, 2]), cpus=1,
                    ram_gb=1.0, gpu=None, gpu_count=0, image=None, region="local", python_version=PYTHON,
                    version=__version__, build=BUILD)


def _ws_frames(rng: random.Random, ctx: Context, route: Route, authorized: bool) -> list[tuple[bytes, bool, str]]:
    frames: list[tuple[bytes, bool, str]] = []
    if route.template == "/v1/jobs/ws":
        if rng.random() < 0.8:
            first = _open_job(rng, ctx)
        else:
            first = _message(wire.ResumeJob, job_id=rng.choice(ctx.live_ids[-10:] or ["none"]),
                             acked_seq=rng.choice([0, -1]))
        job_id = first[_slot(wire.OpenJob, "job_id")]
        n_inputs = first[_slot(wire.OpenJob, "n_inputs")] if first[0] == wire.OpenJob.TAG else 1
        follow = [(lambda: _job_follow_up(rng, ctx, job_id, n_inputs)) for _ in range(rng.choice([0, 1, 2, 3, 5]))]
    else:
        first = _register(rng)
        node_id = first[_slot(wire.RegisterNode, "node_id")]
        follow = [(lambda: _node_follow_up(rng, ctx, node_id)) for _ in range(rng.choice([0, 1, 2, 3, 5, 8]))]
    # The opening frame is mostly well-formed, so that what follows reaches an open channel.
    well_formed = rng.random() < 0.6
    opening = _pack(_defuse(first)) if well_formed else _mutate(rng, first)
    if well_formed and authorized and first[0] == wire.OpenJob.TAG:
        ctx.live_ids.append(job_id)
    frames.append(_wrap(rng, opening) if rng.random() < 0.2 else (_ws_frame(rng, 2, opening), False,
                                                                    f"binary {_describe(opening)}"))
    for make in follow:
        msg = make()
        payload = _pack(_defuse(msg)) if rng.random() < 0.6 else _mutate(rng, msg)
        frames.append(_wrap(rng, payload))
        if frames[-1][1]:
            break  # a cut-off frame ends the stream
    return frames


def _ws_handshake_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    key = base64.b64encode(rng.randbytes(16))
    headers = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Key", key),
               (b"Sec-WebSocket-Version", b"13")]
    r = rng.random()
    if r < 0.03:
        headers[2] = (b"Sec-WebSocket-Key", rng.choice([b"", b"short", b"\xff" * 24]))
    elif r < 0.06:
        headers[3] = (b"Sec-WebSocket-Version", rng.choice([b"8", b"", b"99"]))
    elif r < 0.08:
        headers.append((b"Sec-WebSocket-Extensions", b"permessage-deflate; client_max_window_bits"))
    elif r < 0.1:
        headers.append((b"Sec-WebSocket-Protocol", b"\xff, x"))
    return headers


# --- generating plans ----------------------------------------------------------------------


def plans(rng: random.Random, ctx: Context, count: int) -> Iterator[Plan]:
    routes = [route for route in ROUTES for _ in range(route.weight)]
    for index in range(count):
        route = rng.choice(routes)
        yield _plan(rng, ctx, route, index)


def _plan(rng: random.Random, ctx: Context, route: Route, index: int) -> Plan:
    address = ctx.head if route.base == "head" else ctx.node
    mode, authorization = _auth(rng, ctx, route)
    method = route.method if rng.random() < 0.75 else rng.choice(METHODS)
    right_cancel = mode == "right" and route.template.endswith("/cancel")
    target = _path(rng, ctx, route, right_cancel) + _query(rng, ctx, route)
    host = f"{address[0]}:{address[1]}".encode()
    headers = [(b"Host", host)]
    body: bytes | None = None
    frames: list[tuple[bytes, bool, str]] = []
    ws = route.kind == "ws" and rng.random() < 0.85
    if ws:
        method = b"GET" if rng.random() < 0.97 else rng.choice(METHODS)
        headers += _ws_handshake_headers(rng)
        frames = _ws_frames(rng, ctx, route, mode == "right")
    elif route.body in ("steal", "ack"):
        job_id = rng.choice(ctx.live_ids[-20:]) if ctx.live_ids and rng.random() < 0.7 else f"fuzz-{index}"
        target = b"/v1/jobs/" + _quote(job_id) + (b"/steal/ack" if route.body == "ack" else b"/steal")
        target += _query(rng, ctx, route)
        if rng.random() < 0.2:
            target = b"/v1/jobs/" + _segment(rng, ctx, "job_id") + target[len(b"/v1/jobs/" + _quote(job_id)):]
        body = _steal_body(rng, job_id, route.body == "ack")
    elif route.body == "json" or (method not in SAFE_METHODS and rng.random() < 0.5):
        body = _json_body(rng, ctx, route)
    elif rng.random() < 0.05:
        body = rng.choice([b"", b"{}", rng.randbytes(100)])
    if body is not None and route.body in ("steal", "ack"):
        headers.append((b"Content-Type", b"application/msgpack"))
    elif body is not None and rng.random() < 0.7:
        headers.append((b"Content-Type", b"application/json"))
    headers += _extra_headers(rng)
    if mode == "right" and _right_token_is_unsafe(method, target, body):
        mode = rng.choice(["wrong", "none", "non-utf8"])
        authorization = _auth_header(rng, ctx, mode)
    if authorization is not None:
        headers.append((b"Authorization", authorization))
    plan = Plan(index, route, address, method, target, headers, body, frames=frames, drop=rng.random() < 0.1,
                linger=rng.choice([0.0, 0.0, 0.0, 0.2, 0.5, 1.0]))
    if body is not None and rng.random() < 0.1:
        plan.chunked = True
    if rng.random() < 0.02 and not ws:
        plan.headers.append(rng.choice([(b"Content-Length", b"zz"), (b"Content-Length", b"-1"),
                                        (b"Transfer-Encoding", b"gzip, chunked"), (b"Content-Length", b"5")]))
    return plan


# --- sending -------------------------------------------------------------------------------


def _request_bytes(plan: Plan) -> bytes:
    lines = [plan.method + b" " + plan.target + b" HTTP/1.1", *(k + b": " + v for k, v in plan.headers)]
    payload = b""
    if plan.body is not None:
        if plan.chunked:
            lines.append(b"Transfer-Encoding: chunked")
            size = max(1, len(plan.body) // 3)
            for start in range(0, len(plan.body), size):
                chunk = plan.body[start:start + size]
                payload += b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            payload += b"0\r\n\r\n"
        else:
            lines.append(b"Content-Length: %d" % len(plan.body))
            payload = plan.body
    if not plan.frames:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The status and header block of the response (past any 100 Continue), or None at EOF."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            head = e.partial
            if not head.startswith(b"HTTP/"):
                return None
        parts = head.split(b" ", 2)
        if len(parts) < 2 or not parts[1][:3].isdigit():
            return None
        status = int(parts[1][:3])
        if status != 100:
            return status, head


def _classify(status: int) -> Outcome:
    outcome = Outcome(f"{status // 100}xx")
    if status >= 500:
        outcome.finding = str(status)
    return outcome


async def _http(plan: Plan) -> Outcome:
    reader, writer = await asyncio.open_connection(*plan.address, limit=2**20)
    try:
        with contextlib.suppress(ConnectionError):  # the server may answer before the whole body arrived
            writer.write(_request_bytes(plan))
            await writer.drain()
        try:
            answer = await _read_head(reader)
        except ConnectionResetError:
            return Outcome("reset", "reset", "the connection was reset before any answer")
        if answer is None:
            return Outcome("reset", "closed", "the connection closed without an answer")
        status, head = answer
        outcome = _classify(status)
        if plan.method == b"HEAD":
            pass  # no body, whatever the headers say
        elif b"text/event-stream" in head.lower():
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(4096), STREAM_READ_S)
        else:
            with contextlib.suppress(ConnectionError):
                body = await reader.read()
                if status >= 500:
                    outcome.detail = body[:300].decode("utf-8", "replace")
        return outcome
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """One frame from the server: its opcode, whether it is compressed (RSV1), its payload."""
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await reader.readexactly(8))[0]
    key = await reader.readexactly(4) if second & 0x80 else b""
    payload = await reader.readexactly(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return first & 0x0F, bool(first & 0x40), payload


@dataclass
class _WsState:
    close_code: int | None = None
    sent_close: bool = False
    ended: str = ""  # "eof" or "reset" when the connection ended
    error_replies: list[tuple[str, int, str]] = field(default_factory=list)
    replies: collections.Counter = field(default_factory=collections.Counter)
    inflate: Any = field(default_factory=lambda: zlib.decompressobj(-zlib.MAX_WBITS))  # permessage-deflate


async def _ws_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _WsState,
                   rng: random.Random) -> None:
    while True:
        try:
            opcode, compressed, payload = await _read_frame(reader)
        except asyncio.IncompleteReadError:
            state.ended = "eof"
            return
        except ConnectionError:
            state.ended = "reset"
            return
        if opcode == 8:
            state.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            if not state.sent_close:
                state.sent_close = True
                with contextlib.suppress(ConnectionError, RuntimeError):
                    writer.write(_ws_frame(rng, 8, struct.pack("!H", 1000)))
        elif opcode == 9:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(_ws_frame(rng, 10, payload))
        elif opcode == 2:
            try:
                if compressed:  # the handshake asked for permessage-deflate and the server agreed
                    payload = state.inflate.decompress(payload + b"\x00\x00\xff\xff")
                msg = wire.decode(payload)
            except Exception:
                state.replies["undecodable"] += 1
                continue
            if isinstance(msg, wire.ErrorReply):
                state.replies[f"ErrorReply {msg.kind}"] += 1
                state.error_replies.append((msg.kind, msg.status, msg.message[:200]))
            else:
                state.replies[type(msg).__name__] += 1


async def _websocket(plan: Plan) -> Outcome:
    reader, writer = await asyncio.open_connection(*plan.address, limit=2**20)
    rng = random.Random(plan.index)  # masks of the replies this side sends
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(_request_bytes(plan))
            await writer.drain()
        try:
            answer = await _read_head(reader)
        except ConnectionResetError:
            return Outcome("reset", "reset", "the connection was reset before the handshake was answered")
        if answer is None:
            return Outcome("reset", "closed", "the connection closed before the handshake was answered")
        status, head = answer
        if status != 101:  # the connection may stay open (no Connection: close here): read just the body
            outcome = _classify(status)
            length = re.search(rb"\r\ncontent-length:\s*(\d+)", head.lower())
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                body = await reader.readexactly(int(length.group(1))) if length and plan.method != b"HEAD" else b""
                if status >= 500:
                    outcome.detail = body[:300].decode("utf-8", "replace")
            return outcome
        state = _WsState()
        reading = asyncio.create_task(_ws_read(reader, writer, state, rng))
        cut_off = False
        for data, ends_stream, _ in plan.frames:
            if state.close_code is not None or state.ended:
                break
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, RuntimeError):
                break
            if ends_stream:
                cut_off = True
                with contextlib.suppress(OSError, RuntimeError):
                    writer.write_eof()
                break
            await asyncio.sleep(0)
        if plan.linger and not cut_off:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), plan.linger)
        if plan.drop and not cut_off:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            return Outcome("1xx")
        if not cut_off and not state.sent_close and not state.ended:
            state.sent_close = True
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(_ws_frame(rng, 8, struct.pack("!H", 1000)))
                await writer.drain()
        await reading
        outcome = Outcome("1xx", close_code=state.close_code, replies=state.replies)
        fives = [e for e in state.error_replies if e[1] >= 500]
        if state.close_code in (1006, 1011):
            outcome.finding = f"ws close {state.close_code}"
        elif fives:
            outcome.finding = f"ws ErrorReply {fives[0][1]}"
            outcome.detail = f"{fives[0][0]}: {fives[0][2]}"
        elif state.close_code is None and not cut_off and not state.error_replies:
            outcome.finding = f"ws {state.ended} without a close frame"
        if state.error_replies and not outcome.detail:
            outcome.detail = "; ".join(f"{k} {s}: {m[:80]}" for k, s, m in state.error_replies)
        return outcome
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _execute(plan: Plan) -> Outcome:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            if plan.frames:
                return await _websocket(plan)
            return await _http(plan)
    except TimeoutError:
        return Outcome("timeout", "timeout", f"no answer within {TIMEOUT_S:g} s")
    except ConnectionError as e:
        return Outcome("reset", "reset", f"{type(e).__name__}: {e}")


def _finding(plan: Plan, outcome: Outcome) -> Finding:
    if plan.frames:
        body = " | ".join(what for _, _, what in plan.frames)
    else:
        body = "" if plan.body is None else _describe(plan.body)
    headers = {k.decode("latin-1"): v[:200].decode("latin-1") for k, v in plan.headers}
    path = plan.target.decode("latin-1")
    return Finding(plan.index, plan.route.name, plan.method.decode("latin-1"), path[:500], headers, body[:2000],
                   outcome.finding or outcome.status, outcome.detail)


# --- running -------------------------------------------------------------------------------


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or parts.port is None:
        raise ValueError(f"the fuzzer only talks to http://127.0.0.1:PORT, not {url!r}")
    return parts.hostname, parts.port


async def _get_json(address: tuple[str, int], path: str, token: str) -> dict:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        response = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path} answered {head[:100]!r}")
    return json.loads(body)


async def fuzz(head: Any, node_url: str, rng: random.Random, requests: int, concurrency: int = CONCURRENCY) -> Summary:
    """Send `requests` generated requests to `head` (has .url and .token) and the node at `node_url`."""
    head_address, node_address = _address(head.url), _address(node_url)
    cluster = await _get_json(head_address, "/v1/cluster", head.token)
    jobs = await _get_json(head_address, "/v1/jobs?limit=1000", head.token)
    existing = [j["job_id"] for j in jobs["jobs"]]
    ctx = Context(head.token.encode(), head_address, node_address, sorted(n["node_id"] for n in cluster["nodes"]),
                  list(existing), list(existing))
    summary = Summary()
    generated = plans(rng, ctx, requests)
    start = time.monotonic()

    async def worker() -> None:
        for plan in generated:
            outcome = await _execute(plan)
            summary.requests += 1
            summary.counts.setdefault(plan.route.name, collections.Counter())[outcome.status] += 1
            if outcome.close_code is not None:
                summary.ws_close_codes[outcome.close_code] += 1
            if outcome.replies:
                summary.ws_replies.update(outcome.replies)
            if outcome.finding is not None:
                summary.findings.append(_finding(plan, outcome))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    summary.seconds = time.monotonic() - start
    summary.findings.sort(key=lambda f: f.index)
    return summary


def run(head: Any, node_url: str, rng: random.Random, requests: int, concurrency: int = CONCURRENCY) -> Summary:
    """`fuzz` from synchronous code."""
    return asyncio.run(fuzz(head, node_url, rng, requests, concurrency))
