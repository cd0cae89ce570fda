"""What the core knows of redis-py's clients and errors without making or using one: which errors a call can
raise and which of them are a lost connection, whether a client is a cluster's, how long it waits for a reply, how a URL
is shown, how an instance is named. Making a client is ``redis_txmq.transport.connection``'s."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisClusterException, TryAgainError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
"""The schemes of a URL of Redis behind Sentinel (``redis_txmq.transport.sentinel``) -> TLS."""

REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
"""What a call to Redis can raise: redis-py's cluster errors (``SlotNotCoveredError``...) are not ``RedisError``."""
REDIRECTIONS: tuple[type[Exception], ...] = (MovedError, AskError, TryAgainError, ClusterDownError)
"""Replies of a cluster node that send a call elsewhere (or later): the cluster client follows them."""
CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = (TryAgainError, ClusterDownError)
"""Error replies (``ResponseError``s) of a cluster node that say a slot is not served now (CLUSTERDOWN, MASTERDOWN,
TRYAGAIN: a master just restarted or failing over), not that the call is wrong: like a dropped connection, they
concern the keys of one master."""


def connection_error_of(exc: BaseException) -> redis.ConnectionError | None:
    """The connection error an ``AttributeError`` / ``TypeError`` raised inside redis-py's connection code stands
    for, else None. redis-py's asyncio connection raises them when its socket is closed under a write (its writer
    set to None by a concurrent disconnect, e.g. a cluster node reset during the connect handshake: redis-py issue
    3546): a caller that retries or reports connection errors must see one, not a crash."""
    if not isinstance(exc, (AttributeError, TypeError)):
        return None
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    filename = frame.tb_frame.f_code.co_filename.replace("\\", "/") if frame is not None else ""
    if "/redis/" not in filename or not filename.endswith("connection.py"):
        return None
    error = redis.ConnectionError(f"connection lost under a write ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error


@contextlib.contextmanager
def connection_errors() -> Iterator[None]:
    """Around a Redis call: ``connection_error_of`` applied to what it raises."""
    try:
        yield
    except (AttributeError, TypeError) as exc:
        error = connection_error_of(exc)
        if error is None:
            raise
        raise error from exc


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster client, sync or asyncio."""
    return isinstance(client, RedisCluster) or is_async_cluster(client)


def is_async_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, AsyncRedisCluster)


REDIS_PY_SOCKET_TIMEOUT = 5.0
"""redis-py's own ``socket_timeout`` when the client was given none (its connections' default since 6.0)."""


def socket_timeout_of(client: Any) -> float | None:
    """How long the client waits for a reply before it takes the connection for lost (None: for ever)."""
    try:
        kwargs = client.get_connection_kwargs()
    except AttributeError:
        return REDIS_PY_SOCKET_TIMEOUT
    return kwargs.get("socket_timeout", REDIS_PY_SOCKET_TIMEOUT)


def blocking_slice(wanted: float, socket_timeout: float | None) -> float:
    """The longest a blocking read (XREADGROUP BLOCK) may wait on a healthy server without tripping the client's
    socket timeout, which then stays the bound that notices a hung one: a second under it, or half of a short one.
    A longer wait is several reads."""
    if socket_timeout is None:
        return wanted
    return min(wanted, max(socket_timeout - 1.0, socket_timeout / 2))


def instance_id(kind: str) -> str:
    """A name for this process's instance of a producer, consumer or checker: host, pid and a random part."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def redact_url(url: str) -> str:
    """The URL without its password (before the host, or a ``password=`` of its query: redis-py reads both), for
    logs, errors and pages. A URL whose password, typed unencoded, misleads the parser (a ``/``, ``?`` or ``#`` in
    it reads as the end of the host) is starred out from the user name to the last ``@``."""
    shown = redact_sentinel_url(url) if is_sentinel_url(url) else _redact_parsed(url)
    if any(password and password in shown for password in _passwords(url)):
        return _redact_unparsed(url)
    return shown


def _redact_parsed(url: str) -> str:
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:  # a bad port, say: still shown, for the operator to see what is wrong, without the password
        return _redact_unparsed(url)
    query = _redact_query(parts.query)
    if password is None:
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    user = parts.username or ""
    host = parts.hostname or ""
    if port:
        host = f"{host}:{port}"
    netloc = f"{user}:***@{host}" if user else f":***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_unparsed(url: str) -> str:
    """A URL ``urlsplit`` refuses, without what may be a password: a password typed unencoded may hold ``/``, ``?``
    or ``@``, so everything between the user name and the last ``@`` goes (more than the password, rather than
    less), and the query's password arguments."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")
    if at:
        user = userinfo.split(":", 1)[0] if ":" in userinfo else userinfo
        rest = f"{user}:***@{after}" if ":" in userinfo else f"{user}@{after}"
    head, question, query = rest.partition("?")
    return f"{scheme}{sep}{head}{question}{_redact_query(query)}"


SECRET_QUERY_NAMES = frozenset({"password", "sentinel_password"})
"""Query arguments of a Redis URL that hold a password (redis-py's ``from_url`` and our Sentinel URLs)."""


def _redact_query(query: str) -> str:
    """``query`` with the value of each password argument replaced by ``***`` (whatever its case or encoding)."""
    if not query:
        return query
    pairs = []
    for pair in query.split("&"):
        name, eq, _ = pair.partition("=")
        pairs.append(f"{name}=***" if eq and unquote(name).strip().lower() in SECRET_QUERY_NAMES else pair)
    return "&".join(pairs)


MIN_SCRUBBED_SECRET = 4
"""A password shorter than this is not starred out of free text (it would star out ordinary words)."""


def url_secrets(*urls: str | None) -> tuple[str, ...]:
    """What must never be shown of ``urls``: each URL itself and its passwords (before the host, or a ``password=`` /
    ``sentinel_password=`` of its query: redis-py reads both), as written and decoded, longest first (so that a
    password inside a URL is starred out with the URL)."""
    found: list[str] = []
    for url in urls:
        if not url:
            continue
        found.append(url)
        for password in _passwords(url):
            if len(password) >= MIN_SCRUBBED_SECRET:
                found += [password, unquote(password)]
    return tuple(sorted(set(found), key=len, reverse=True))


def _passwords(url: str) -> list[str]:
    """What may be a password in ``url``: the user info's, however it was typed — it ends at the first ``@`` of a
    URL that parses, at the last of one typed with ``/``, ``?`` or ``@`` in its password: both are taken (a longer
    one starred out hides the shorter inside it too) —, and the values of the query's password arguments."""
    rest = url.partition("://")[2]
    passwords = []
    for userinfo in (rest.partition("/")[0].partition("?")[0].rpartition("@")[0], rest.rpartition("@")[0]):
        if userinfo:
            passwords.append(userinfo.partition(":")[2])
    for argument in url.partition("?")[2].split("&"):
        name, _, value = argument.partition("=")
        if unquote_plus(name).strip().lower() in SECRET_QUERY_NAMES:
            passwords += [value, unquote_plus(value)]
    return [password for password in passwords if password]


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` on one line with each of ``secrets`` (``url_secrets``) replaced: a URL by ``redact_url``'s form of
    it, a password by ``***``."""
    passwords = [secret for secret in secrets if "://" not in secret]
    for secret in secrets:
        if secret in text:
            shown = redact_url(secret) if "://" in secret else "***"
            if any(password in shown for password in passwords):  # a URL too odd for redact_url to find its password
                shown = "***"
            text = text.replace(secret, shown)
    return " ".join(text.split())


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def redact_sentinel_url(url: str) -> str:
    """The URL with its passwords (the data's and the Sentinels') replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    rest, question, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    return f"{scheme}{sep}{userinfo}{at}{hosts}{slash}{path}{question}{_redact_query(query)}"


def server_ms(client: Any) -> int:
    """The Redis server's clock in milliseconds (``TIME``): ages are measured on it, never on this host's clock."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
