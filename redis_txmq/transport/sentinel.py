"""Redis behind Sentinel: ``redis+sentinel://`` URLs, resolved through redis-py's ``Sentinel``.

``redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]`` (``rediss+sentinel://`` for TLS to
the Sentinels and to Redis). The user and password in the URL are the data's (Redis's own ACL user); the Sentinels'
are apart, as ``sentinel_username`` / ``sentinel_password`` query parameters or the ``sentinel_password`` keyword
(from ``TXMQ_SENTINEL_PASSWORD``, or Spark's ``redis.sentinelPassword``). Other query parameters are redis-py's
(``socket_timeout``, ``ssl_ca_certs``...).

The client asks the Sentinels for the master on every new connection; after a failover, a call on a connection to
the old master fails once (a connection error, or READONLY from a demoted master, which redis-py turns into one) and
the next finds the new master: producers, checkers and consumers follow a failover without a restart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from ..core.clients import SENTINEL_SCHEMES as SCHEMES
from ..core.clients import is_sentinel_url as is_sentinel_url  # defined here in 0.1.0
from ..core.clients import redact_url as redact
from ..core.errors import ConfigurationError

_SENTINEL_QUERY = ("sentinel_username", "sentinel_password")
_STRING_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_ca_path", "client_name")


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ssl: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def parse(url: str) -> SentinelTarget:
    """Parse a Sentinel URL; [`ConfigurationError`][redis_txmq.core.errors.ConfigurationError] (without the password)
    when it is malformed."""
    scheme, _, rest = url.partition("://")
    shown = redact(url)
    if scheme.lower() not in SCHEMES:
        raise ConfigurationError(f"{shown!r} is not a redis+sentinel:// or rediss+sentinel:// URL")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = []
    for host_port in filter(None, hosts.split(",")):
        host, colon, port = host_port.rpartition(":")
        if not colon or not port.isdigit() or not host:
            if not at and "@" in url:  # user info cut short by a "/" or "?" of its password: never echo a part of it
                raise ConfigurationError(
                    f"Sentinel URL {shown!r}: no Sentinel host:port before the path; a password holding '/', '?' or "
                    "'#' must be percent-encoded"
                )
            raise ConfigurationError(f"Sentinel URL {shown!r}: {host_port!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    if not sentinels:
        raise ConfigurationError(f"Sentinel URL {shown!r}: no Sentinel host:port")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ConfigurationError(
            f"Sentinel URL {shown!r}: the path must be /service_name or /service_name/db (the name Sentinel monitors)"
        )
    options: dict[str, Any] = {}
    sentinel_auth: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in _SENTINEL_QUERY:
            sentinel_auth[name] = value
        else:
            options[name] = _query_value(name, value, shown)
    return SentinelTarget(
        sentinels=sentinels,
        service_name=parts[0],
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=username,
        password=password,
        sentinel_username=sentinel_auth.get("sentinel_username") or None,
        sentinel_password=sentinel_auth.get("sentinel_password") or None,
        ssl=SCHEMES[scheme.lower()],
        options=options,
    )


def _query_value(name: str, value: str, shown: str) -> Any:
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    if name in _STRING_OPTIONS:
        return value
    parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
    if parser is None:
        raise ConfigurationError(f"Sentinel URL {shown!r}: unknown query parameter {name!r}")
    try:
        return parser(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"Sentinel URL {shown!r}: invalid value for {name!r}") from None


def connect(url: str, *, asyncio: bool = False, sentinel_password: str | None = None, **kwargs: Any) -> Any:
    """A client of the master that the Sentinels of ``url`` name (``redis.asyncio`` with ``asyncio=True``);
    ``kwargs`` (a password, timeouts...) apply to the master's connections and override the URL."""
    target = parse(url)
    data: dict[str, Any] = {"db": target.db, **target.options}
    if target.username is not None:
        data["username"] = target.username
    if target.password is not None:
        data["password"] = target.password
    if target.ssl:
        data["ssl"] = True
    data.update(kwargs)
    sentinel_kwargs: dict[str, Any] = {k: v for k, v in data.items() if k.startswith(("socket_", "ssl"))}
    if target.sentinel_username is not None:
        sentinel_kwargs["username"] = target.sentinel_username
    password = sentinel_password if sentinel_password is not None else target.sentinel_password
    if password is not None:
        sentinel_kwargs["password"] = password
    if asyncio:
        from redis.asyncio import Redis as AsyncRedis
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        manager: Any = AsyncSentinel(target.sentinels, sentinel_kwargs=sentinel_kwargs, **data)
        return manager.master_for(target.service_name, redis_class=AsyncRedis)
    import redis
    from redis.sentinel import Sentinel

    return Sentinel(target.sentinels, sentinel_kwargs=sentinel_kwargs, **data).master_for(
        target.service_name, redis_class=redis.Redis
    )
