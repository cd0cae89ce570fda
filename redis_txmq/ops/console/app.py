"""The console's web application (Starlette): the pages, their JSON twins, the login and the dead-letter actions.

Safe by default. It answers only requests naming it by a local name or an allowed host (no DNS rebinding), and
without an operator token it is read-only: no action is rendered and every POST is refused (403). With one, an
operator logs in with it (throttled: a few wrong tokens a minute); the session is the process's own (a random id in
a signed cookie, the ids in memory: logging out ends it, a restart ends them all) and every POST carries its CSRF
token. An action names whole transaction ids only, is confirmed on a page of its own before it runs, is recorded in
the audit before it runs (no record, no action) and after, with what it did, read back from Redis when it failed
part-way; it runs ``admin.resolve_dead_target`` (what ``txmq dead`` runs). Pages show the Redis URL redacted at
most; errors are pages, never tracebacks (debug is off, every error has its handler)."""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...core import entries
from ...core.clients import REDIS_ERRORS, redact_url, scrub, url_secrets
from ...core.config import Settings
from ...core.errors import ConfigurationError, TxMQConnectionError, TxMQError
from ...core.keys import AUDIT_MAXLEN, AUDIT_STREAM, decision_key
from ...core.protocol import DeadAction, message_index
from ...sync.broker import RedisBroker
from .. import admin
from ..admin import DeadTarget
from .queries import (
    MAX_PAGE,
    MAX_PAGE_SIZE,
    BadRequest,
    ConsoleOptions,
    ConsoleQueries,
    NotFound,
    StatusPending,
    entry_id_arg,
    filter_arg,
    page_args,
    partition_arg,
    seconds_arg,
    sparkline,
    topic_arg,
    transaction_id_arg,
    whole_number_arg,
)

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "txmq_console"
SESSION_SECONDS = 8 * 3600
OPERATOR_NAME = re.compile(r"[A-Za-z0-9 _.@-]{1,64}")
MAX_ACTION_ITEMS = 500
READING_ID = "reading"
"""The element of the page that says the figures are being read; its poll, once they are, reloads the page."""
MAX_SESSIONS = 10_000
"""Sessions kept at most (the oldest is dropped past it): a bound on memory, far beyond the operators of a
deployment."""
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
"""Host headers always answered: the console's own machine. Any other name must be allowed by name
(``allowed_hosts``, ``txmq console --allowed-host``): a page elsewhere that gets its name resolved to 127.0.0.1 (DNS
rebinding) sends its own name, and is refused."""
MAX_BODY_BYTES = 1_000_000
"""A request body larger than this is refused (413) before it is read: the largest form the console takes (500 ids
and a remark) is far smaller."""
LOGIN_WINDOW_SECONDS = 60.0
LOGIN_FAILURES_PER_CLIENT = 5
"""Wrong operator tokens taken from one client address per ``LOGIN_WINDOW_SECONDS``; the next login from it is
answered 429 until the oldest of them is a window old."""
LOGIN_FAILURES_OVERALL = 20
"""Wrong operator tokens taken from every address together per window (many addresses, one guesser)."""
AUDIT_ACL_HINT = (
    "the operator's Redis user (TXMQ_CONSOLE_OPERATOR_REDIS_URL, else --redis-url) needs to write the audit "
    f"stream: add the key pattern ~{AUDIT_STREAM} to it (with XADD: the checker's rules of `txmq acl checker` have it)"
)
ACTIONS = {"commit": DeadAction.COMMIT, "rollback": DeadAction.ROLLBACK, "recheck": DeadAction.RECHECK}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
API = [
    ("/api/overview", "txmq status --json's report, and totals, layout versions, checkers, attention, rates"),
    ("/api/topics", "topics, paged: ?q=&sort=&order=&page=&size="),
    ("/api/topics/{topic}", "one topic: partitions, consumer groups, messages: ?partition=&before=&after=&size="),
    ("/api/transactions", "a transaction: ?id=<transaction id>&parts=<page of its messages> or ?key=<key>&topic="),
    ("/api/dead", "dead letters, paged: ?topic=&group=&reason=&min_age=&page=&size="),
    ("/api/audit", "the audit trail, newest first: ?before=&size="),
    ("/api/jobs", "write jobs not settled: ?page=&size="),
]


class Sessions:
    """The operators logged in to this process: a random session id (what the signed cookie holds) -> the name and
    when they logged in. Logging out forgets the id, so a copy of the cookie is worth nothing after it; a session
    ends ``seconds`` after the login whatever is asked meanwhile; a restart forgets them all."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._live: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, operator: str) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._live[session_id] = (operator, self.clock())
            while len(self._live) > MAX_SESSIONS:
                self._live.popitem(last=False)
        return session_id

    def operator(self, session_id: Any) -> str | None:
        """Who is logged in with this id (None: nobody, it ended, or it never was)."""
        if not isinstance(session_id, str):
            return None
        with self._lock:
            found = self._live.get(session_id)
            if found is not None and self.clock() - found[1] >= self.seconds:
                del self._live[session_id]
                found = None
        return found[0] if found else None

    def close(self, session_id: Any) -> None:
        if isinstance(session_id, str):
            with self._lock:
                self._live.pop(session_id, None)


class LoginThrottle:
    """Wrong operator tokens, counted in a sliding window per client address and overall: past either bound, logins
    are refused (429) without looking at the token, until the window passes."""

    def __init__(
        self,
        per_client: int = LOGIN_FAILURES_PER_CLIENT,
        overall: int = LOGIN_FAILURES_OVERALL,
        window: float = LOGIN_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_client, self.overall, self.window, self.clock = per_client, overall, window, clock
        self._clients: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()
        self._lock = threading.Lock()

    def _forget_old(self, now: float) -> None:
        while self._all and now - self._all[0] >= self.window:
            self._all.popleft()
        for address in list(self._clients):
            times = self._clients[address]
            while times and now - times[0] >= self.window:
                times.popleft()
            if not times:
                del self._clients[address]

    def wait(self, address: str) -> tuple[float, str]:
        """Seconds before ``address`` may try a token (0: now), and why."""
        with self._lock:
            now = self.clock()
            self._forget_old(now)
            mine = self._clients.get(address)
            if mine is not None and len(mine) >= self.per_client:
                return mine[0] + self.window - now, f"{self.per_client} wrong operator tokens from your address"
            if len(self._all) >= self.overall:
                return self._all[0] + self.window - now, f"{self.overall} wrong operator tokens from every address"
        return 0.0, ""

    def failed(self, address: str) -> None:
        with self._lock:
            now = self.clock()
            self._clients.setdefault(address, deque()).append(now)
            self._all.append(now)


class BodyLimit:
    """Refuses (413) a request body over ``max_bytes``: at once when its Content-Length says so, else as soon as
    more has arrived (a body sent in chunks), before the form is parsed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than {self.max_bytes:,} bytes: refused"
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length and (not length.isdigit() or int(length) > self.max_bytes):
            await PlainTextResponse(too_large, status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, too_large)
            return message

        await self.app(scope, limited, send)


@dataclass
class ConsoleState:
    """What every request of one console shares."""

    queries: ConsoleQueries
    settings: Settings
    operator_token: str | None
    action_client: Any
    shown_url: str
    secrets_to_hide: tuple[str, ...]
    sessions: Sessions = field(default_factory=lambda: Sessions(SESSION_SECONDS))
    throttle: LoginThrottle = field(default_factory=LoginThrottle)


class SecurityHeaders:
    """Headers that keep the pages in their own frame and origin (no inline script: htmx and ours are files)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def _ms_time(ms: Any) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every page: what Redis holds is shown as text, never as markup
        undefined=jinja2.StrictUndefined,
    )
    env.filters["age"] = _age
    env.filters["ms_time"] = _ms_time
    env.globals["sparkline"] = sparkline
    return Jinja2Templates(env=env)


def _scrubbed(text: str, state: ConsoleState) -> str:
    return scrub(text, state.secrets_to_hide)


def _host_patterns(allowed_hosts: Sequence[str]) -> list[str]:
    """The Host names answered: the local ones and ``allowed_hosts`` (a name, ``*.<domain>`` or ``*``)."""
    for host in allowed_hosts:
        if not host or "*" in host[1:] or (host.startswith("*") and host != "*" and not host.startswith("*.")):
            raise ConfigurationError(
                f"allowed host {host[:80]!r}: give a host name, an address, '*.<domain>' for its subdomains or '*' "
                "for any"
            )
    return list(dict.fromkeys([*LOCAL_HOSTS, *(host.lower() for host in allowed_hosts)]))


def _targets(client: Any, items: list[tuple[str, str]]) -> tuple[list[DeadTarget], list[str]]:
    """What acting on each of ``items`` (topic, whole transaction id) would touch (``DeadTarget``), and why an item is
    refused: an id that is not exactly a dead letter's (nor one resolved before: a repeat), on any partition of its
    topic, is never looked up by prefix, as ``txmq dead`` does for ids typed by hand."""
    registry = admin.registered_topics(client)
    found: list[DeadTarget] = []
    refused: list[str] = []
    for topic, txid in items:
        partitions = [keys for keys in registry if keys.topic == topic]
        pipe = client.pipeline(transaction=False)
        for keys in partitions:
            pipe.hget(keys.dead_index, txid)
            pipe.hexists(keys.ended, txid)
            pipe.hexists(keys.inflight, txid)
        replies = pipe.execute() if partitions else []
        where = [(keys, *replies[3 * i : 3 * i + 3]) for i, keys in enumerate(partitions)]
        dead = [(keys, dead_id) for keys, dead_id, _, _ in where if dead_id is not None]
        known = [keys for keys, _, ended, in_flight in where if ended or in_flight]
        if not dead and not known:
            refused.append(
                f"{txid} on topic {topic}: not the whole id of a dead letter (the console takes whole ids only, "
                "as the dead-letter list shows them)"
            )
            continue
        keys = dead[0][0] if dead else known[0]
        found.append(admin.dead_target(client, keys, txid))
    return found, refused


def _states(client: Any, target: DeadTarget) -> tuple[list[dict[str, Any]], str | None, set[int]]:
    """Where each message of ``target`` is now (``DEAD_LETTERED``, ``COMMITTED`` with its entry id,
    ``ROLLED_BACK``, ``IN_FLIGHT``, or ``UNKNOWN``: in none of the indexes), the decision of its transaction of
    several (None: none, or one message) and the indices of its sends that did not return (rolled back whatever the
    decision)."""
    pipe = client.pipeline(transaction=False)
    for keys, txid in target.parts:
        pipe.hexists(keys.dead_index, txid)
        pipe.hget(keys.ended, txid)
        pipe.hexists(keys.inflight, txid)
    if target.parent:
        pipe.hmget(decision_key(target.parent), ["outcome", "voided"])
    replies = pipe.execute()
    states = []
    for i, (keys, txid) in enumerate(target.parts):
        dead, ended, in_flight = replies[3 * i : 3 * i + 3]
        state: dict[str, Any] = {"transaction_id": txid, "stream": keys.topic_stream, "entry_id": None}
        if dead:
            state["state"] = "DEAD_LETTERED"
        elif ended is not None:
            record = entries.ended_record(ended)
            state["state"], state["entry_id"] = record.state, record.committed_id
        elif in_flight:
            state["state"] = "IN_FLIGHT"
        else:
            state["state"] = "UNKNOWN"
        states.append(state)
    decision, voided = (entries.text(value) for value in replies[-1]) if target.parent else (None, None)
    return states, decision or None, {int(i) for i in (voided or "").split() if i.isascii() and i.isdigit()}


PART_STATES = {
    "DEAD_LETTERED": "still dead-lettered",
    "COMMITTED": "published",
    "ROLLED_BACK": "rolled back",
    "IN_FLIGHT": "back in flight",
    "UNKNOWN": "in no index now (read it on the transaction page)",
}


RESOLVED_STATES = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK", "PREPARED": "IN_FLIGHT"}
"""``dead_resolve.lua``'s answer -> where the message is now."""


def _part_text(part: dict[str, Any]) -> str:
    text = f"{part['transaction_id']} on {part['stream']}: {PART_STATES[part['state']]}"
    if part.get("entry_id"):
        text += f" as {part['entry_id']}"
    return text


def create_app(
    client: Any,
    settings: Settings,
    *,
    operator_token: str | None,
    action_client: Any = None,
    options: ConsoleOptions | None = None,
    redis_url: str | None = None,
    action_redis_url: str | None = None,
    allowed_hosts: Sequence[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The console on ``client`` (its reads: the ``console`` ACL role is enough). ``operator_token`` enables the
    actions (None: read-only); they run on ``action_client`` (the operator's user; ``client`` when not given).
    ``redis_url`` is shown redacted and, like ``action_redis_url``, starred out of every error shown or logged.

    Requests must name the console by a local name (``LOCAL_HOSTS``) or one of ``allowed_hosts`` in their Host
    header (``"*"``: any, for an application that checks it itself); bodies over ``max_body_bytes`` are refused."""
    options = options or ConsoleOptions()
    hosts = _host_patterns(allowed_hosts)
    if operator_token is not None and len(operator_token) < 8:
        raise TxMQError("the console's operator token must be at least 8 characters: generate a long random one")
    state = ConsoleState(
        queries=ConsoleQueries(
            client, settings.heartbeat_interval * 3, options, max_transaction_messages=settings.max_transaction_messages
        ),
        settings=settings,
        operator_token=operator_token,
        action_client=action_client if action_client is not None else client,
        shown_url=redact_url(redis_url) if redis_url else "",
        secrets_to_hide=url_secrets(redis_url, action_redis_url),
    )
    templates = _templates()

    def context(request: Request, **values: Any) -> dict[str, Any]:
        return {
            "request": request,
            "writable": state.operator_token is not None,
            "operator": _operator(request),
            "csrf": _csrf(request),
            "shown_url": state.shown_url,
            "refresh_ms": int(options.refresh_seconds * 1000),
            "max_page_size": MAX_PAGE_SIZE,
            **values,
        }

    def _operator(request: Request) -> str | None:
        """The operator of the request's session, if it is one this process opened and has not ended."""
        if state.operator_token is None:
            return None
        return state.sessions.operator(request.session.get("sid"))

    def _csrf(request: Request) -> str:
        token = request.session.get("csrf")
        if not token:
            token = request.session["csrf"] = secrets.token_urlsafe(32)
        return token

    def page(
        name: str, template: str, read: Callable[[Request], dict[str, Any] | None]
    ) -> tuple[Callable[[Request], Awaitable[Response]], Callable[[Request], Awaitable[Response]]]:
        """The HTML page (its live part alone when htmx polls it) and the JSON endpoint of one reader."""

        async def html(request: Request) -> Response:
            data = await run_in_threadpool(read, request)
            live = request.headers.get("hx-request") == "true"
            if live and request.headers.get("hx-trigger") == READING_ID:
                return Response(headers={"HX-Refresh": "true"})  # the figures are read: the whole page, anew
            shown = f"live/{template}" if live else template
            return templates.TemplateResponse(request, shown, context(request, page=name, data=data))

        async def api(request: Request) -> Response:
            while True:
                try:
                    data = await run_in_threadpool(read, request)
                    break
                except StatusPending:
                    await run_in_threadpool(q.cache.wait_read)
            if data is None:
                raise BadRequest("give ?id=<transaction id> or ?key=<message key>")
            return JSONResponse(data)

        return html, api

    q = state.queries

    def read_overview(request: Request) -> dict[str, Any]:
        return q.overview()

    def read_topics(request: Request) -> dict[str, Any]:
        p = request.query_params
        number, size = page_args(p.get("page"), p.get("size"))
        sort, order = filter_arg(p.get("sort"), "sort") or "topic", filter_arg(p.get("order"), "order") or "asc"
        return q.topics(filter_arg(p.get("q"), "q"), sort, order, number, size)

    def read_topic(request: Request) -> dict[str, Any]:
        p = request.query_params
        topic = topic_arg(request.path_params["topic"])
        _, size = page_args(None, p.get("size"))
        return q.topic(
            topic,
            partition_arg(p.get("partition")),
            entry_id_arg(p.get("before"), "before"),
            entry_id_arg(p.get("after"), "after"),
            size,
        )

    def read_transaction(request: Request) -> dict[str, Any] | None:
        p = request.query_params
        if p.get("id"):
            parts = p.get("parts")
            page = whole_number_arg(parts, "parts", 1, MAX_PAGE, 1) if parts else None
            return q.transaction(transaction_id_arg(p.get("id")), page)
        if p.get("key"):
            return q.by_key(filter_arg(p.get("key"), "key"), topic_arg(p.get("topic")))
        return None

    def read_dead(request: Request) -> dict[str, Any]:
        p = request.query_params
        number, size = page_args(p.get("page"), p.get("size"))
        age = seconds_arg(p.get("min_age"), "min_age")
        topic, group, reason = topic_arg(p.get("topic")), filter_arg(p.get("group"), "group"), p.get("reason")
        return q.dead_letters(topic, group, filter_arg(reason, "reason"), age, number, size)

    def read_audit(request: Request) -> dict[str, Any]:
        p = request.query_params
        _, size = page_args(None, p.get("size"))
        return q.audit(entry_id_arg(p.get("before"), "before"), size)

    def read_jobs(request: Request) -> dict[str, Any]:
        p = request.query_params
        number, size = page_args(p.get("page"), p.get("size"))
        return q.jobs(number, size)

    pages = {
        "overview": ("/", "/api/overview", "overview.html", read_overview),
        "topics": ("/topics", "/api/topics", "topics.html", read_topics),
        "topic": ("/topics/{topic}", "/api/topics/{topic}", "topic.html", read_topic),
        "transactions": ("/transactions", "/api/transactions", "transactions.html", read_transaction),
        "dead": ("/dead", "/api/dead", "dead.html", read_dead),
        "audit": ("/audit", "/api/audit", "audit.html", read_audit),
        "jobs": ("/jobs", "/api/jobs", "jobs.html", read_jobs),
    }
    routes: list[Any] = []
    for name, (path, api_path, template, read) in pages.items():
        html, api = page(name, template, read)
        routes += [Route(path, html, name=name), Route(api_path, api, name=f"api_{name}")]

    async def api_index(request: Request) -> Response:
        return JSONResponse({"endpoints": [{"path": path, "what": what} for path, what in API]})

    # login ------------------------------------------------------------------------------------------------------

    async def checked_form(request: Request, *, logged_in: bool = True) -> Any:
        """The form of a POST, once the console takes actions, the CSRF token matches and (``logged_in``) an
        operator is logged in: else 403."""
        if state.operator_token is None:
            raise HTTPException(403, "the console is read-only: no operator token is configured")
        form = await request.form()
        expected = request.session.get("csrf") or ""
        given = str(form.get("csrf") or "")
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page and try again")
        if logged_in and not _operator(request):
            raise HTTPException(403, "log in as an operator first")
        return form

    async def login_page(request: Request) -> Response:
        if state.operator_token is None:
            raise HTTPException(404, "the console is read-only: there is nothing to log in to")
        return templates.TemplateResponse(request, "login.html", context(request, page="login", error=None))

    async def login(request: Request) -> Response:
        """A login. A refused one is logged with the client's address only: what was typed into the name field
        may be the token (the fields swapped), and never reaches a log."""
        form = await checked_form(request, logged_in=False)
        address = request.client.host if request.client else "unknown"
        wait, why = state.throttle.wait(address)
        if wait > 0:
            logger.warning("console: a login from %s was refused unread: %s in a minute", address, why)
            seconds = math.ceil(wait)
            message = f"{why} in the last minute: logins are refused for {seconds} s more; try again then"
            response = templates.TemplateResponse(request, "login.html", context(request, page="login", error=message))
            response.status_code = 429
            response.headers["retry-after"] = str(seconds)
            return response
        name = str(form.get("operator") or "").strip()
        token = str(form.get("token") or "")
        assert state.operator_token is not None
        expected = state.operator_token.encode()
        status = 403
        if hmac.compare_digest(name.encode(), expected):
            state.throttle.failed(address)
            logger.warning("console: a login from %s was refused (the name field held the token)", address)
            error = "refused: that is the operator token in the name field; type your own name there"
        elif not OPERATOR_NAME.fullmatch(name):
            error, status = "give your name (letters, digits, space and _.@-, at most 64): the audit records it", 400
        elif not hmac.compare_digest(token.encode(), expected):
            state.throttle.failed(address)
            logger.warning("console: a login from %s was refused (wrong token)", address)
            error = "wrong operator token"
        else:
            request.session.clear()
            request.session.update({"sid": state.sessions.open(name), "csrf": secrets.token_urlsafe(32)})
            logger.info("console: %s logged in from %s", name, address)
            return RedirectResponse("/dead", status_code=303)
        response = templates.TemplateResponse(request, "login.html", context(request, page="login", error=error))
        response.status_code = status
        return response

    async def logout(request: Request) -> Response:
        await checked_form(request, logged_in=False)
        state.sessions.close(request.session.get("sid"))
        request.session.clear()
        return RedirectResponse("/", status_code=303)

    # actions ----------------------------------------------------------------------------------------------------

    def chosen_items(form: Any) -> tuple[DeadAction, list[tuple[str, str]]]:
        action_name = str(form.get("action") or "")
        if action_name not in ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(ACTIONS)}, got {action_name[:20]!r}")
        items = []
        chosen = form.getlist("tx")
        if len(chosen) > MAX_ACTION_ITEMS:
            raise BadRequest(f"at most {MAX_ACTION_ITEMS} dead letters at once, got {len(chosen)}")
        for value in chosen:
            topic, _, txid = str(value).partition(" ")
            items.append((topic_arg(topic), transaction_id_arg(txid)))
        if not items:
            raise BadRequest("choose at least one dead letter")
        return ACTIONS[action_name], list(dict.fromkeys(items))

    async def confirm(request: Request) -> Response:
        form = await checked_form(request)
        action, items = chosen_items(form)
        targets, refused = await run_in_threadpool(_targets, state.action_client, items)
        if refused:
            raise BadRequest("nothing to confirm: " + "; ".join(refused[:5]) + ("; …" if len(refused) > 5 else ""))
        return templates.TemplateResponse(
            request, "confirm.html", context(request, page="dead", action=action.value.lower(), targets=targets)
        )

    def act(broker: RedisBroker, operator: str, action: DeadAction, target: DeadTarget, note: str) -> dict[str, Any]:
        """One chosen dead letter: the audit record of the intent, the action, then its outcome, read back from
        Redis when the action failed (a transaction of several may have been resolved in part)."""
        name = action.value.lower()
        row: dict[str, Any] = {
            "topic": target.topic,
            "transaction_id": target.transaction_id,
            "action": name,
            "ids": target.ids(),
            "ok": False,
            "outcome": "refused",
            "parts": [],
            "intent": None,
        }
        before, decided_before, _ = _states(state.action_client, target)  # to tell what the action changed
        try:
            row["intent"] = _audit_intent(operator, name, target)
        except REDIS_ERRORS as exc:
            reason = _scrubbed(str(exc), state)
            row["result"] = f"refused, nothing done: its audit record cannot be written ({reason}); {AUDIT_ACL_HINT}"
            logger.error("console: %s %s %s refused: no audit record: %s", operator, name, target.ids(), reason)
            return row
        try:
            resolved = admin.resolve_dead_target(broker, target, action, note)
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, what it did is read back and recorded
            error = _scrubbed(str(exc) or type(exc).__name__, state)
            if not isinstance(exc, (TxMQError, *REDIS_ERRORS)):
                logger.error("console: %s %s failed: %s", name, target.ids(), _scrubbed(repr(exc), state))
            _reread(row, action, target, before, decided_before, error)
        else:
            row.update(ok=True, outcome="done")
            row["parts"] = [
                {
                    "transaction_id": one.transaction_id,
                    "stream": one.keys.topic_stream,
                    "state": RESOLVED_STATES.get(one.result.state, "UNKNOWN"),
                    "entry_id": one.result.committed_id or None,
                    "applied": one.result.applied,
                }
                for one in resolved
            ]
            row["result"] = "; ".join(
                _part_text(part) + ("" if part["applied"] else " (already done)") for part in row["parts"]
            )
        for part in row["parts"]:
            part["text"] = _part_text(part)
        _audit_outcome(operator, row)
        return row

    def _reread(
        row: dict[str, Any],
        action: DeadAction,
        target: DeadTarget,
        before: list[dict[str, Any]],
        decided_before: str | None,
        error: str,
    ) -> None:
        """The truth after a failed action, per message: which it resolved, which it did not, and why. A message
        counts as applied when it was dead-lettered before and is now where this action sends it (the decision, a
        send that did not return rolled back; back in flight for a recheck): one ended otherwise meanwhile was
        ended by someone else."""
        try:
            after, decided, voided = _states(state.action_client, target)
        except REDIS_ERRORS as exc:
            row["result"] = (
                f"failed: {error}; what it did cannot be read back ({_scrubbed(str(exc), state)}): "
                "look the transaction up, and run the same action again to finish"
            )
            row["outcome"] = "unknown"
            return

        def sent_to(txid: str) -> str:
            if action is DeadAction.RECHECK:
                return "IN_FLIGHT"
            if target.parent and message_index(target.parent, txid) in voided:
                return "ROLLED_BACK"
            return RESOLVED_STATES[decided or action.value]

        for old, new in zip(before, after, strict=True):
            new["applied"] = old["state"] == "DEAD_LETTERED" and new["state"] == sent_to(new["transaction_id"])
        row["parts"] = after
        applied = [part for part in after if part["applied"]]
        newly_decided = decided == action.value and decided_before is None
        if not applied and not newly_decided:
            row["result"] = f"refused: {error}"
            return
        row["outcome"] = "partial"
        left = [part for part in after if part["state"] == "DEAD_LETTERED"]
        said = [_part_text(part) for part in applied] or ["no message resolved yet"]
        if newly_decided:
            said.insert(0, f"transaction {target.parent} decided {decided}")
        if left:
            said.append("not resolved: " + ", ".join(_part_text(part) for part in left))
        row["result"] = (
            f"partly done: {'; '.join(said)}; it stopped at: {error}. "
            "Run the same action again to finish (the decision stands: a repeat resolves what is left)"
        )

    def _audit_intent(operator: str, action: str, target: DeadTarget) -> str:
        """The record of what is about to be done (raises when it cannot be written: then nothing is done)."""
        fields = {
            "operator": operator,
            "action": action,
            "transaction_id": target.transaction_id,
            "topic": target.topic,
            "phase": "intent",
            "intent": "",
            "ids": target.ids(),
            "ok": "",
            "outcome": "",
            "applied": "",
            "result": f"about to {action} {target.ids()}",
        }
        logger.info("console: %s is about to %s %s", operator, action, target.ids())
        entry_id = state.action_client.xadd(AUDIT_STREAM, fields, maxlen=AUDIT_MAXLEN, approximate=True)
        return entries.text(entry_id) or ""

    def _audit_outcome(operator: str, row: dict[str, Any]) -> None:
        fields = {
            "operator": operator,
            "action": row["action"],
            "transaction_id": row["transaction_id"],
            "topic": row["topic"],
            "phase": "outcome",
            "intent": row["intent"] or "",
            "ids": row["ids"],
            "ok": "1" if row["ok"] else "0",
            "outcome": row["outcome"],
            "applied": "; ".join(_part_text(part) for part in row["parts"] if part["applied"]),
            "result": row["result"][:1000],
        }
        logger.info("console: %s %s %s: %s", operator, row["action"], row["ids"], row["result"])
        try:
            state.action_client.xadd(AUDIT_STREAM, fields, maxlen=AUDIT_MAXLEN, approximate=True)
        except REDIS_ERRORS as exc:  # the action is done: say the record is missing rather than hide the result
            reason = _scrubbed(str(exc), state)
            row["result"] += f" (the audit record of this outcome was not written: {reason}; its intent was)"
            logger.error("console: the audit record of the outcome %s was not written: %s", fields, reason)

    def apply_items(operator: str, action: DeadAction, items: list[tuple[str, str]], remark: str) -> list[dict]:
        broker = RedisBroker(state.action_client, state.settings)
        note = f"console: {operator}" + (f": {remark}" if remark else "")
        targets, refused = _targets(state.action_client, items)
        by_item = {(t.topic, t.transaction_id): t for t in targets}
        results = []
        for topic, txid in items:
            target = by_item.get((topic, txid))
            if target is None:
                reason = next(r for r in refused if r.startswith(f"{txid} on topic {topic}:"))
                logger.warning("console: %s %s refused: %s", operator, action.value.lower(), reason)
                results.append(
                    {
                        "topic": topic,
                        "transaction_id": txid,
                        "action": action.value.lower(),
                        "ids": txid,
                        "ok": False,
                        "outcome": "refused",
                        "parts": [],
                        "intent": None,
                        "result": f"refused, nothing done: {reason}",
                    }
                )
                continue
            results.append(act(broker, operator, action, target, note))
        state.queries.cache.invalidate()
        return results

    async def apply(request: Request) -> Response:
        form = await checked_form(request)
        action, items = chosen_items(form)
        remark = filter_arg(str(form.get("remark") or ""), "remark")
        operator = _operator(request) or ""
        results = await run_in_threadpool(apply_items, operator, action, items, remark)
        done = sum(r["outcome"] == "done" for r in results)
        again = any(r["outcome"] in ("partial", "unknown") for r in results)
        if done == len(results):
            heading = "done"
        elif again:
            heading = "partly done: read each row"
        elif not done:
            heading = "refused: nothing done"
        else:
            heading = f"done for {done} of {len(results)}: read each row"
        values = {"action": action.value.lower(), "results": results, "items": items}
        return templates.TemplateResponse(
            request, "applied.html", context(request, page="dead", heading=heading, again=again, **values)
        )

    # errors -----------------------------------------------------------------------------------------------------

    def error_response(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api"):
            return JSONResponse({"error": message, "status": status}, status_code=status)
        live = request.headers.get("hx-request") == "true"
        template = "live/error.html" if live else "error.html"
        values = context(request, page="error", status=status, message=message)
        return templates.TemplateResponse(request, template, values, status_code=status)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return error_response(request, 400, str(exc))

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(request, 404, str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = exc.detail if exc.status_code != 404 or exc.detail != "Not Found" else "no such page"
        return error_response(request, exc.status_code, str(detail))

    async def pending(request: Request, exc: Exception) -> Response:
        live = request.headers.get("hx-request") == "true"
        template = "live/reading.html" if live else "reading.html"
        values = context(request, page="reading", message=str(exc), reading_id=READING_ID)
        return templates.TemplateResponse(request, template, values)

    async def unavailable(request: Request, exc: Exception) -> Response:
        message = _scrubbed(f"Redis cannot be read now ({type(exc).__name__}: {exc})", state)
        logger.warning("console: %s %s: %s", request.method, request.url.path, message)
        return error_response(request, 503, message + "; the page retries by itself")

    async def failed(request: Request, exc: Exception) -> Response:
        logger.error("console: %s %s failed: %s", request.method, request.url.path, _scrubbed(repr(exc), state))
        return error_response(request, 500, "the console failed on this page; the log says why")

    handlers: dict[Any, Any] = {
        BadRequest: bad_request,
        StatusPending: pending,
        NotFound: not_found,
        HTTPException: http_error,
        TxMQConnectionError: unavailable,
        Exception: failed,
    }
    for error in REDIS_ERRORS:
        handlers[error] = unavailable
    routes += [
        Route("/api", api_index, name="api"),
        Route("/login", login_page, methods=["GET"], name="login_page"),
        Route("/login", login, methods=["POST"], name="login"),
        Route("/logout", logout, methods=["POST"], name="logout"),
        Route("/dead/confirm", confirm, methods=["POST"], name="dead_confirm"),
        Route("/dead/apply", apply, methods=["POST"], name="dead_apply"),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        Middleware(BodyLimit, max_bytes=max_body_bytes),
        Middleware(
            SessionMiddleware,
            secret_key=secrets.token_urlsafe(32),  # per process: a restart logs everybody out
            session_cookie=SESSION_COOKIE,
            max_age=SESSION_SECONDS,
            same_site="strict",
        ),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await run_in_threadpool(q.cache.start)  # at thousands of topics, the first page finds its figures read
        except REDIS_ERRORS as exc:
            logger.warning("console: the first read of the status failed: %s", _scrubbed(str(exc), state))
        yield

    app = Starlette(debug=False, routes=routes, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)
    app.state.console = state
    return app
