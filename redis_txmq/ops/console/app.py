"""The console's web application (Starlette): the pages, their JSON twins, the login and the dead-letter actions.

Safe by default. Without an operator token it is read-only: no action is rendered and every POST is refused (403).
With one, an operator logs in with it (a signed session cookie, its secret random per process) and every POST
carries the session's CSRF token; an action is confirmed on a page of its own before it runs, runs
``admin.resolve_dead_transaction`` (what ``txmq dead`` runs) and leaves an audit record in Redis. Pages show the
Redis URL redacted at most; errors are pages, never tracebacks (debug is off, every error has its handler)."""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...core.clients import REDIS_ERRORS, redact_url
from ...core.config import Settings
from ...core.errors import TxMQConnectionError, TxMQError
from ...core.keys import AUDIT_MAXLEN, AUDIT_STREAM
from ...core.protocol import DeadAction
from ...sync.broker import RedisBroker
from .. import admin
from .queries import (
    MAX_PAGE_SIZE,
    BadRequest,
    ConsoleOptions,
    ConsoleQueries,
    NotFound,
    entry_id_arg,
    filter_arg,
    page_args,
    sparkline,
    topic_arg,
    transaction_id_arg,
)

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "txmq_console"
SESSION_SECONDS = 8 * 3600
OPERATOR_NAME = re.compile(r"^[A-Za-z0-9 _.@-]{1,64}$")
MAX_ACTION_ITEMS = 500
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
    ("/api/transactions", "a transaction: ?id=<transaction id> or ?key=<message key>&topic="),
    ("/api/dead", "dead letters, paged: ?topic=&group=&reason=&min_age=&page=&size="),
    ("/api/audit", "the audit trail, newest first: ?before=&size="),
    ("/api/jobs", "write jobs not settled: ?page=&size="),
]


@dataclass
class ConsoleState:
    """What every request of one console shares."""

    queries: ConsoleQueries
    settings: Settings
    operator_token: str | None
    action_client: Any
    shown_url: str
    secrets_to_hide: tuple[str, ...]


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
    for secret in state.secrets_to_hide:
        text = text.replace(secret, "***")
    return " ".join(text.split())


def _secrets_of(*urls: str | None) -> tuple[str, ...]:
    """The URLs and their passwords, to be starred out of any error shown or logged."""
    found: list[str] = []
    for url in urls:
        if not url:
            continue
        found.append(url)
        try:
            password = urlsplit(url).password
        except ValueError:
            continue
        if password and len(password) >= 4:
            found += [password, unquote(password)]
    return tuple(sorted(set(found), key=len, reverse=True))


def create_app(
    client: Any,
    settings: Settings,
    *,
    operator_token: str | None,
    action_client: Any = None,
    options: ConsoleOptions | None = None,
    redis_url: str | None = None,
    action_redis_url: str | None = None,
) -> Starlette:
    """The console on ``client`` (its reads: the ``console`` ACL role is enough). ``operator_token`` enables the
    actions (None: read-only); they run on ``action_client`` (the operator's user; ``client`` when not given).
    ``redis_url`` is shown redacted and, like ``action_redis_url``, starred out of every error shown or logged."""
    options = options or ConsoleOptions()
    if operator_token is not None and len(operator_token) < 8:
        raise TxMQError("the console's operator token must be at least 8 characters: generate a long random one")
    state = ConsoleState(
        queries=ConsoleQueries(client, settings.heartbeat_interval * 3, options),
        settings=settings,
        operator_token=operator_token,
        action_client=action_client if action_client is not None else client,
        shown_url=redact_url(redis_url) if redis_url else "",
        secrets_to_hide=_secrets_of(redis_url, action_redis_url),
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
        if state.operator_token is None:
            return None
        return request.session.get("operator")

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
            shown = f"live/{template}" if live else template
            return templates.TemplateResponse(request, shown, context(request, page=name, data=data))

        async def api(request: Request) -> Response:
            data = await run_in_threadpool(read, request)
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
        return q.topics(filter_arg(p.get("q"), "q"), p.get("sort") or "topic", p.get("order") or "asc", number, size)

    def read_topic(request: Request) -> dict[str, Any]:
        p = request.query_params
        topic = topic_arg(request.path_params["topic"])
        _, size = page_args(None, p.get("size"))
        partition = p.get("partition")
        if partition not in (None, "") and not partition.isdigit():
            raise BadRequest(f"partition must be a whole number, got {partition[:20]!r}")
        return q.topic(
            topic,
            int(partition) if partition else None,
            entry_id_arg(p.get("before"), "before"),
            entry_id_arg(p.get("after"), "after"),
            size,
        )

    def read_transaction(request: Request) -> dict[str, Any] | None:
        p = request.query_params
        if p.get("id"):
            return q.transaction(transaction_id_arg(p.get("id")))
        if p.get("key"):
            return q.by_key(filter_arg(p.get("key"), "key"), topic_arg(p.get("topic")))
        return None

    def read_dead(request: Request) -> dict[str, Any]:
        p = request.query_params
        number, size = page_args(p.get("page"), p.get("size"))
        min_age = p.get("min_age") or ""
        try:
            age = float(min_age) if min_age else None
        except ValueError:
            raise BadRequest(f"min_age must be a number of seconds, got {min_age[:20]!r}") from None
        if age is not None and not 0 <= age < 10**9:
            raise BadRequest(f"min_age must be 0 or more seconds, got {min_age[:20]!r}")
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

    # actions ----------------------------------------------------------------------------------------------------

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
        form = await checked_form(request, logged_in=False)
        name = str(form.get("operator") or "").strip()
        token = str(form.get("token") or "")
        assert state.operator_token is not None
        if not OPERATOR_NAME.match(name):
            error = "give your name (letters, digits, space and _.@-, at most 64): the audit records it"
        elif not hmac.compare_digest(token.encode(), state.operator_token.encode()):
            logger.warning("console: a login as %r was refused (wrong token)", name)
            error = "wrong operator token"
        else:
            request.session.clear()
            request.session.update({"operator": name, "csrf": secrets.token_urlsafe(32), "at": int(time.time())})
            logger.info("console: %s logged in", name)
            return RedirectResponse("/dead", status_code=303)
        response = templates.TemplateResponse(request, "login.html", context(request, page="login", error=error))
        response.status_code = 400 if "name" in error else 403
        return response

    async def logout(request: Request) -> Response:
        await checked_form(request, logged_in=False)
        request.session.clear()
        return RedirectResponse("/", status_code=303)

    def chosen_items(form: Any) -> tuple[DeadAction, list[tuple[str, str]]]:
        action_name = str(form.get("action") or "")
        if action_name not in ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(ACTIONS)}, got {action_name[:20]!r}")
        items = []
        for value in form.getlist("tx"):
            topic, _, txid = str(value).partition(" ")
            items.append((topic_arg(topic), transaction_id_arg(txid)))
        if not items:
            raise BadRequest("choose at least one dead letter")
        if len(items) > MAX_ACTION_ITEMS:
            raise BadRequest(f"at most {MAX_ACTION_ITEMS} dead letters at once, got {len(items)}")
        return ACTIONS[action_name], list(dict.fromkeys(items))

    async def confirm(request: Request) -> Response:
        form = await checked_form(request)
        action, items = chosen_items(form)
        return templates.TemplateResponse(
            request, "confirm.html", context(request, page="dead", action=action.value.lower(), items=items)
        )

    def apply_items(operator: str, action: DeadAction, items: list[tuple[str, str]], remark: str) -> list[dict]:
        broker = RedisBroker(state.action_client, state.settings)
        results = []
        note = f"console: {operator}" + (f": {remark}" if remark else "")
        for topic, txid in items:
            row: dict[str, Any] = {"topic": topic, "transaction_id": txid, "action": action.value.lower()}
            try:
                parent, resolved = admin.resolve_dead_transaction(broker, txid, action, topic, note)
            except (TxMQError, *REDIS_ERRORS) as exc:  # type: ignore[misc]  # a tuple of classes
                row.update(ok=False, result=f"refused: {_scrubbed(str(exc), state)}", resolved=[])
            else:
                row.update(
                    ok=True,
                    parent=parent,
                    resolved=[
                        {
                            "transaction_id": one.transaction_id,
                            "stream": one.keys.topic_stream,
                            "state": one.result.state,
                            "committed_id": one.result.committed_id or None,
                            "applied": one.result.applied,
                        }
                        for one in resolved
                    ],
                )
                row["result"] = "; ".join(
                    f"{r['transaction_id']}: {r['state']}" + ("" if r["applied"] else " (already done)")
                    for r in row["resolved"]
                )
            _audit(operator, row)
            results.append(row)
        state.queries.cache.invalidate()
        return results

    def _audit(operator: str, row: dict[str, Any]) -> None:
        fields = {
            "operator": operator,
            "action": row["action"],
            "transaction_id": row["transaction_id"],
            "topic": row["topic"],
            "ok": "1" if row["ok"] else "0",
            "result": row["result"][:1000],
        }
        logger.info(
            "console: %s %s transaction %s on %s: %s",
            operator,
            row["action"],
            row["transaction_id"],
            row["topic"],
            row["result"],
        )
        try:
            state.action_client.xadd(AUDIT_STREAM, fields, maxlen=AUDIT_MAXLEN, approximate=True)
        except REDIS_ERRORS as exc:  # the action is done: say the record is missing rather than hide the result
            row["result"] += f" (audit record not written: {_scrubbed(str(exc), state)})"
            logger.error("console: audit record of %s not written: %s", row, _scrubbed(str(exc), state))

    async def apply(request: Request) -> Response:
        form = await checked_form(request)
        action, items = chosen_items(form)
        remark = filter_arg(str(form.get("remark") or ""), "remark")
        operator = _operator(request) or ""
        results = await run_in_threadpool(apply_items, operator, action, items, remark)
        return templates.TemplateResponse(
            request, "applied.html", context(request, page="dead", action=action.value.lower(), results=results)
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

    async def unavailable(request: Request, exc: Exception) -> Response:
        message = _scrubbed(f"Redis cannot be read now ({type(exc).__name__}: {exc})", state)
        logger.warning("console: %s %s: %s", request.method, request.url.path, message)
        return error_response(request, 503, message + "; the page retries by itself")

    async def failed(request: Request, exc: Exception) -> Response:
        logger.error("console: %s %s failed: %s", request.method, request.url.path, _scrubbed(repr(exc), state))
        return error_response(request, 500, "the console failed on this page; the log says why")

    handlers: dict[Any, Any] = {
        BadRequest: bad_request,
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
        Middleware(
            SessionMiddleware,
            secret_key=secrets.token_urlsafe(32),  # per process: a restart logs everybody out
            session_cookie=SESSION_COOKIE,
            max_age=SESSION_SECONDS,
            same_site="strict",
        ),
    ]
    app = Starlette(debug=False, routes=routes, middleware=middleware, exception_handlers=handlers)
    app.state.console = state
    return app
