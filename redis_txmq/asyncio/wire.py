"""The wire: commands written on one connection in one write, the replies read back one by one.

Every writer that sends more than one command at a time goes through here: the sync send path's script runner
(``redis_txmq.transport.direct``), the asyncio lane (``redis_txmq/asyncio/lane.py``), the one-way flusher (through the
broker's runner) and the Spark writer's stage writes. With a durability level (``redis_txmq.core.durability``) the
confirming ``WAIT`` / ``WAITAOF`` goes in the same write, after the commands, and its reply is read with theirs: one
wait confirms every command of the write. A write that had to be sent again (a connection error) cannot be confirmed:
the repeat of an idempotent script writes nothing, so a ``WAIT`` after it proves nothing about the first; the
confirmation is then None. The asyncio wire's module is the source; the sync one's is generated from it by
``scripts/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ..core.batching import PACKING_ERRORS, ScriptCall, unsendable_error
from ..core.durability import Durability
from ..transport.connection import pack_commands

Packer = Callable[[tuple[Any, ...]], bytes] | None


async def exchange(
    conn: Any,
    commands: Sequence[Sequence[Any]],
    *,
    pack: Packer,
    durability: Durability | None,
    connect_first: bool = False,
) -> tuple[list[Any], Any]:
    """Write every command at once (and the durability command), then read each reply: a refused command's error
    takes its reply's place, and so does the ``UnsendableCallError`` of a command that cannot be packed (an argument
    UTF-8 cannot encode), which is left out of the write: one caller's bad text never fails the others' commands.
    Returns the replies and the confirmation's reply (None without a durability level; its error, if the server refused
    it). ``connect_first``: redis-py reconnects lazily in ``send_packed_command``, past the override by which a
    Sentinel-managed connection asks the Sentinels for the master."""
    if connect_first:
        await conn.connect()
    written = [*commands, durability.command] if durability is not None else commands
    try:
        packed, refused = pack_commands(conn, pack, written), None
    except PACKING_ERRORS:
        packed, refused = _pack_each(conn, pack, written)
    if packed:
        await conn.send_packed_command([packed])
    replies: list[Any] = []
    for i in range(len(written)):
        if refused is not None and i in refused:
            replies.append(refused[i])
            continue
        try:
            replies.append(await conn.read_response())
        except redis.ResponseError as exc:
            replies.append(exc)
    confirmation = replies.pop() if durability is not None else None
    return replies, confirmation


def _pack_each(conn: Any, pack: Packer, commands: Sequence[Sequence[Any]]) -> tuple[bytes, dict[int, Exception]]:
    """The commands that can be packed, as one write, and the error of each that cannot (by its index)."""
    packed: list[bytes] = []
    refused: dict[int, Exception] = {}
    for i, command in enumerate(commands):
        try:
            packed.append(pack_commands(conn, pack, [command]))
        except PACKING_ERRORS as exc:
            refused[i] = unsendable_error(exc)
    return b"".join(packed), refused


async def exchange_with_retry(
    conn: Any,
    commands: Sequence[Sequence[Any]],
    *,
    pack: Packer,
    durability: Durability | None,
    connect_first: bool = False,
) -> tuple[list[Any], Any]:
    """``exchange`` under the connection's retry policy, and once more on a new socket after a connection error:
    a socket the server closed while it sat idle (``timeout`` setting, restart, failover) shows only when used. Only
    for idempotent commands (every script of this library is), so a second attempt applies nothing twice; the
    confirmation is None when the commands were sent more than once."""
    try:  # the common case first, without the retry machinery's cost on the send path
        return await exchange(conn, commands, pack=pack, durability=durability, connect_first=connect_first)
    except (redis.ConnectionError, redis.TimeoutError):
        await conn.disconnect()

    async def attempt() -> tuple[list[Any], Any]:
        return await exchange(conn, commands, pack=pack, durability=durability, connect_first=connect_first)

    async def failed(_error: Exception) -> None:
        await conn.disconnect()

    try:
        replies, _ = await conn.retry.call_with_retry(attempt, failed)
    except redis.ConnectionError:
        await conn.disconnect()
        replies, _ = await conn.retry.call_with_retry(attempt, failed)
    return replies, None  # sent more than once: a confirmation proves nothing about the first send


async def run_scripts(
    conn: Any,
    calls: Sequence[ScriptCall],
    *,
    pack: Packer,
    durability: Durability | None,
    connect_first: bool = False,
) -> tuple[list[Any], Any]:
    """EVALSHA of every call in one write (``exchange_with_retry``); the calls of a script the server does not
    have (NOSCRIPT: a restart, a failover, ``SCRIPT FLUSH``) are sent again after a ``SCRIPT LOAD`` of it in one
    more write, so that a second try of that write on a new socket (which may reach a new master) loads it there
    too. Returns the replies (a refused call's error in its place) and the confirmation (None when it cannot
    count)."""
    commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]
    replies, confirmation = await exchange_with_retry(
        conn, commands, pack=pack, durability=durability, connect_first=connect_first
    )
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if not missing:
        return replies, confirmation
    scripts = list({id(calls[i][0]): calls[i][0] for i in missing}.values())
    loads = [("SCRIPT", "LOAD", script.script) for script in scripts]
    resent = [("EVALSHA", calls[i][0].sha, len(calls[i][1]), *calls[i][1], *calls[i][2]) for i in missing]
    again, confirmed_again = await exchange_with_retry(
        conn, [*loads, *resent], pack=pack, durability=durability, connect_first=connect_first
    )
    refused = {id(script): reply for script, reply in zip(scripts, again, strict=False) if isinstance(reply, Exception)}
    for i, reply in zip(missing, again[len(loads) :], strict=True):
        # a refused load (an ACL) says more than the NOSCRIPT that follows it; a call that ran keeps its reply
        replies[i] = refused.get(id(calls[i][0]), reply) if isinstance(reply, NoScriptError) else reply
    # NOSCRIPT ran nothing: the calls it refused ran in the second write, whose confirmation covers them and
    # follows the first write's on the same connection
    return replies, (confirmed_again if confirmation is not None else None)
