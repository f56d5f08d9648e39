"""What the fuzzer works with: the routes it aims at, the plan of one request (or WebSocket
session) and what the cluster knows for generating it, and the results: each request's outcome,
the findings and the summary of a run."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

# --- results -------------------------------------------------------------------------------


# Frames that break RFC 6455: the server may fail the connection without a close frame (§7.1.7),
# which a text frame that isn't UTF-8 requires too (§8.1). Its close frame, if it sends one, can
# also be lost: closing with the client's frames unread resets the connection.
PROTOCOL_VIOLATIONS = ("unmasked", "reserved bits", "unknown opcode", "continuation without start", "text not utf-8",
                       "control frame over 125 bytes")

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
    Route("head", b"GET", "/v1/head", queries=("window_s",)),
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


def describe(payload: bytes) -> str:
    return repr(payload[:120]) + (f"... ({len(payload)} bytes)" if len(payload) > 120 else "")
