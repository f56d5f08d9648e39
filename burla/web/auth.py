"""Who may call the head or a node: the cluster's bearer token, or (for the dashboard in a
browser) a session cookie: a full one from `burla dashboard`'s one-time code, or one job's
read-only one from the link a client prints for that job (burla.web.login_links).

Every endpoint but the health check and the login link itself requires one of them; tokens
and codes are compared in constant time. A cookie is ambient (the browser sends it whatever
page asks), so it authorises only reads: GET pages, the JSON API's GETs and the SSE streams.
A POST with a cookie also needs the `X-Burla-CSRF` header (which no cross-origin page can send
without a preflight the head never grants) and an `Origin` equal to the head's own; a WebSocket
needs a bearer token. A job's session reads that job and its nested jobs only (the head says
which requests those are: `job_view`), and never writes. A scoped bearer token (a job's or a
node's, burla.web.scoped_tokens) is let through only to what the head's `scope_check` allows it.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from burla.web.json_io import error_response
from burla.web.login_links import Session, SignedSessions, check_link_code
from burla.web.scoped_tokens import Scope, is_scoped, scope_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health", "/login", "/static/style.css"})
SESSION_COOKIE = "burla_session"
LOGIN_CODE_TTL_S = 300.0
CSRF_HEADER = "X-Burla-CSRF"
CREDENTIAL = "burla_credential"  # request key: which credential authenticated it (budgets count per credential)
JOB_SESSION = "burla_job_session"  # request key: the job a job's session reads (absent for other credentials)
SCOPE = "burla_scope"  # request key: the Scope of a scoped bearer token (absent for other credentials)
_UNSAFE_IN_REDIRECT = frozenset(chr(c) for c in range(0x21)) | {"\x7f", "\\"}


JobView = Callable[[web.Request, str], Awaitable[bool]]  # (request, session's job) -> may it read this?
ScopeCheck = Callable[[web.Request, Scope], Awaitable[str | None]]  # why a scoped token may not make it (None: may)


class Sessions:
    """Browser sign-ins: one-time codes minted on request (`burla dashboard`, five minutes, kept
    in memory only: a restart voids every one), which open full sessions; links a client signed
    with the token (a job's printed link), which open that job's read-only session as often as
    they are opened until they expire. Sessions are signed cookie values
    (burla.web.login_links), valid across head restarts."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._signed = SignedSessions(token)
        self._codes: dict[str, float] = {}  # code -> expiry (monotonic)

    def new_code(self) -> str:
        self._expire()
        code = secrets.token_urlsafe(24)
        self._codes[code] = time.monotonic() + LOGIN_CODE_TTL_S
        return code

    def redeem(self, code: str) -> str | None:
        """Trade a code (once) for a session; None if it is unknown, used or expired."""
        self._expire()
        given = code.encode("utf-8", "surrogatepass")
        match = next((c for c in self._codes if hmac.compare_digest(c.encode(), given)), None)
        if match is None:
            return None
        del self._codes[match]
        return self._signed.new()

    def redeem_link(self, path: str, code: str, job_id: str) -> str | None:
        """A read-only session of job `job_id` until the link expires, for a valid code of its
        page `path`; None if the code is not one."""
        expires = check_link_code(self._token, path, code)
        if expires is None:
            return None
        return self._signed.new(job_id=job_id, expires=expires)

    def session(self, value: str | None) -> Session | None:
        return self._signed.session(value)

    def valid(self, value: str | None) -> bool:
        return self._signed.valid(value)

    def _expire(self) -> None:
        now = time.monotonic()
        for code in [c for c, expiry in self._codes.items() if expiry <= now]:
            del self._codes[code]


def same_origin_path(target: str) -> bool:
    """Whether a redirect target stays on this origin: an absolute path, never `//host` or a
    form browsers turn into one (backslashes, or tabs and newlines they strip)."""
    return (target.startswith("/") and not target.startswith("//")
            and not any(c in _UNSAFE_IN_REDIRECT for c in target))


def bearer_of(request: web.Request) -> str | None:
    given = request.headers.get("Authorization", "")
    return given[7:].strip() if given.startswith("Bearer ") else None


def bearer_matches(request: web.Request, expected: bytes) -> bool:
    given = bearer_of(request)
    # Header bytes that aren't UTF-8 arrive as surrogate escapes, which plain encode() refuses.
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)


def cookie_refusal(request: web.Request) -> str | None:
    """Why a request carrying only a session cookie may not go on (None: it may)."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return "WebSockets need 'Authorization: Bearer <token>'; a session cookie is not enough"
    if request.method in ("GET", "HEAD"):
        return None
    own_origin = f"{request.scheme}://{request.host}"
    if request.headers.get(CSRF_HEADER) != "1" or request.headers.get("Origin") != own_origin:
        return (f"a {request.method} with a session cookie needs the {CSRF_HEADER}: 1 header and Origin "
                f"{own_origin}; tools use 'Authorization: Bearer <token>'")
    return None


class _Gate:
    """token_middleware's checks, one credential each: `None` from one means "not this kind"."""

    def __init__(self, token: str, sessions: Sessions | None, on_authenticated: Callable[[web.Request], None] | None,
                 job_view: JobView | None, scope_check: ScopeCheck | None) -> None:
        self.token = token
        self.expected = token.encode()
        self.sessions = sessions
        self.on_authenticated = on_authenticated
        self.job_view = job_view
        self.scope_check = scope_check

    async def let_in(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.on_authenticated is not None:
            self.on_authenticated(request)
        return await handler(request)

    async def scoped(self, request: web.Request, handler: Handler) -> web.StreamResponse | None:
        """The answer to a request with a scoped token of this cluster (None: it has none)."""
        bearer = bearer_of(request)
        if self.scope_check is None or bearer is None or not is_scoped(bearer):
            return None
        scope = scope_of(self.token, bearer)
        if scope is None:
            return None
        refusal = await self.scope_check(request, scope)
        if refusal is not None:
            return error_response(403, "Forbidden", refusal)
        request[SCOPE] = scope
        request[CREDENTIAL] = f"{scope.kind} {scope.subject}"
        return await self.let_in(request, handler)

    async def session_may(self, request: web.Request, session: Session) -> bool:
        if session.job_id is None:
            return True
        return (request.method in ("GET", "HEAD") and self.job_view is not None
                and await self.job_view(request, session.job_id))


def token_middleware(token: str, sessions: Sessions | None = None, login_page: Handler | None = None,
                     on_authenticated: Callable[[web.Request], None] | None = None,
                     authenticates_itself: Callable[[str], bool] | None = None, job_view: JobView | None = None,
                     scope_check: ScopeCheck | None = None):
    """Reject any request without `Authorization: Bearer <token>`, a scoped token `scope_check`
    lets through, or a valid session cookie (which authorises reads, and writes only from the
    head's own pages; a job's session only what `job_view` says reads that job). Paths for which
    `authenticates_itself` is true check a credential of their own (a transfer grant)."""
    gate = _Gate(token, sessions, on_authenticated, job_view, scope_check)

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or (authenticates_itself is not None and authenticates_itself(request.path)):
            return await handler(request)
        if bearer_matches(request, gate.expected):
            request[CREDENTIAL] = "cluster token"
            return await gate.let_in(request, handler)
        answer = await gate.scoped(request, handler)
        if answer is not None:
            return answer
        session = sessions.session(request.cookies.get(SESSION_COOKIE)) if sessions is not None else None
        if session is not None and await gate.session_may(request, session):
            refusal = cookie_refusal(request)
            if refusal is not None:
                return error_response(403, "Forbidden", refusal)
            if session.job_id is not None:
                request[JOB_SESSION] = session.job_id
            return await gate.let_in(request, handler)
        if login_page is not None and request.method == "GET" and not request.path.startswith("/v1/"):
            return await login_page(request)
        if session is not None:
            return error_response(403, "Forbidden", f"this browser's session reads job {session.job_id} and its "
                                  "nested jobs only (it came from that job's link); `burla dashboard` opens them all")
        return error_response(
            401, "Unauthorized",
            "Missing or wrong cluster token. Send 'Authorization: Bearer <token>'; the token is in "
            "the burla config directory (file cluster_token) or BURLA_CLUSTER_TOKEN.",
        )

    return require_token
