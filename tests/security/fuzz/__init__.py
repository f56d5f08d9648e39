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

The package's modules, one role each: `model` (routes, plans, outcomes, findings, `Summary`),
`values` (random values and wire messages, malformed or not), `http_requests` (paths, queries,
headers and bodies of HTTP requests), `websocket` (handshakes and frames of WebSocket sessions),
`generator` (the seeded sequence of plans), `transport` (raw-socket sending and reading) and
`runner` (`fuzz` and `run`).
"""

from tests.security.fuzz.generator import plans
from tests.security.fuzz.http_requests import ABSENT_JOB, METHODS, QUERY_NAMES, SAFE_METHODS
from tests.security.fuzz.model import ROUTES, Context, Finding, Outcome, Plan, Route, Summary
from tests.security.fuzz.runner import CONCURRENCY, fuzz, run
from tests.security.fuzz.transport import STREAM_READ_S, TIMEOUT_S
from tests.security.fuzz.values import MAX_INPUTS_OF_A_FUZZ_JOB, MAX_STRING, SURROGATES, UNICODE, WILD_FLOATS, WILD_INTS
from tests.security.fuzz.websocket import BUILD, PICKLED_ABS, PYTHON

__all__ = [
    "ABSENT_JOB", "BUILD", "CONCURRENCY", "MAX_INPUTS_OF_A_FUZZ_JOB", "MAX_STRING", "METHODS", "PICKLED_ABS",
    "PYTHON", "QUERY_NAMES", "ROUTES", "SAFE_METHODS", "STREAM_READ_S", "SURROGATES", "TIMEOUT_S", "UNICODE",
    "WILD_FLOATS", "WILD_INTS", "Context", "Finding", "Outcome", "Plan", "Route", "Summary", "fuzz", "plans", "run",
]
