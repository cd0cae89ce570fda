"""Prepares, or ends, of one topic partition written together go as one call of their batch script.

Whatever writes several script calls at once — the asyncio lane (``redis_txmq/asyncio/lane.py``) and the sync runner's
pipelines (``redis_txmq.transport.direct.ScriptRunner``: a one-way producer's flusher, a checker's batch of answers, the
messages of a transaction of several) — hands its calls to ``coalesce``: the ``prepare_half`` / ``end_transaction``
calls that share KEYS (one topic partition) and their number of arguments become ``prepare_halves`` /
``end_transactions`` calls (``lua/``), which apply the same rules to each in turn, one reply each, and read and write
the indexes once for all of them. ``spread`` gives every call its own reply back. One script invocation per batch
instead of one per call is what the server saves; every prepare and every end is idempotent, so a repeat of the batch (a
connection error, NOSCRIPT) applies none twice.

A call whose arguments cannot be sent (a ``str`` UTF-8 cannot encode, such as a lone surrogate, or a value of a type
Redis has no form for) fails alone with ``UnsendableCallError``: ``coalesce`` never packs it into a batch call with
others, and the wire (``redis_txmq.sync.wire.exchange``) leaves it out of the write, its error in its reply's place. The
other calls of the same write go through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis

from .scripts import register_topic_script

ScriptCall = tuple[Any, Sequence[Any], Sequence[Any]]
"""``(script, keys, args)``: a redis-py script object (sync or asyncio), its KEYS and ARGV."""
Span = int | tuple[int, ...]
"""What a call on the wire carries: one call as given (its index), or the indices of the prepares or ends that one
``prepare_halves`` / ``end_transactions`` call carries."""
PREPARE_SCRIPT, PREPARES_SCRIPT = "prepare_half", "prepare_halves"
END_SCRIPT, ENDS_SCRIPT = "end_transaction", "end_transactions"
MAX_PER_BATCH_CALL = 64
"""Prepares or ends per batch call: a call holds the server for about this many calls' time (about 1 ms at 64),
and past a few dozen the invocation it saves is a small share of one."""


class UnsendableCallError(redis.DataError, redis.ResponseError):
    """A call the client could not put on the wire (an argument that cannot be encoded): nothing of it was sent.
    A ``ResponseError`` too, so every runner hands it to its caller in the call's place, as a refusal of that call
    alone, never as a failure of the write."""


_PLAIN = (bytes, memoryview, int, float)


def unsendable(keys: Sequence[Any], args: Sequence[Any]) -> UnsendableCallError | None:
    """Why a call's KEYS and ARGV cannot be sent (as redis-py's and hiredis's packers with UTF-8 see them), or None."""
    if _plain(args) and _plain(keys):
        return None
    for kind, values in (("KEYS", keys), ("ARGV", args)):
        for i, value in enumerate(values, 1):
            reason = _unsendable_value(value)
            if reason is not None:
                return UnsendableCallError(f"{kind}[{i}] {reason}; nothing of this call was sent")
    return None


def _plain(values: Sequence[Any]) -> bool:
    """True when every value is ASCII text, an int or bytes: what the library sends, told apart without encoding."""
    for value in values:
        kind = type(value)
        if kind is str:
            if value.isascii():
                continue
        elif kind is int or kind is bytes:
            continue
        return False
    return True


def _unsendable_value(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"cannot be encoded as UTF-8 ({exc.reason} at position {exc.start}: {value[exc.start : exc.end]!r})"
        return None
    if isinstance(value, bool) or not isinstance(value, _PLAIN):
        return f"is a {type(value).__name__}, which Redis has no form for"
    return None


def unsendable_error(exc: Exception) -> UnsendableCallError:
    """The error of a call a packer refused (``UnicodeEncodeError``, ``TypeError``, ``redis.DataError``)."""
    return UnsendableCallError(f"the call cannot be sent ({exc}); nothing of it was sent")


PACKING_ERRORS = (ValueError, TypeError, redis.DataError)
"""What a command packer raises for an argument it cannot encode (``UnicodeEncodeError`` is a ``ValueError``)."""


def batch_scripts(client: Any, *, prepares: bool = True, ends: bool = True) -> dict[str, Any]:
    """The digest of ``prepare_half`` / ``end_transaction`` (the text every broker registers) -> its batch script,
    registered on ``client`` (loaded on first use: NOSCRIPT)."""
    batched: dict[str, Any] = {}
    if prepares:
        batched[register_topic_script(client, PREPARE_SCRIPT).sha] = register_topic_script(client, PREPARES_SCRIPT)
    if ends:
        batched[register_topic_script(client, END_SCRIPT).sha] = register_topic_script(client, ENDS_SCRIPT)
    return batched


def coalesce(calls: Sequence[ScriptCall], batched: Mapping[str, Any]) -> tuple[list[ScriptCall], list[Span] | None]:
    """The calls to write for ``calls`` and what each carries (None: each one call as given): the calls of a
    script of ``batched`` (its digest -> its batch script) that share KEYS and their number of arguments become calls of
    the batch script, up to ``MAX_PER_BATCH_CALL`` each, at the place of the first of them; the rest go as they are,
    among them any call that cannot be sent (``unsendable``), which the wire refuses alone."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    if batched:
        for i, (script, keys, args) in enumerate(calls):
            # a call that cannot be sent goes as it is: the wire refuses it alone, not the batch call around it
            if script.sha not in batched or not _plain(args) and unsendable((), args) is not None:
                continue
            group = (script.sha, len(args), *keys)
            members = groups.get(group)
            if members is None:
                if not _plain(keys) and unsendable(keys, ()) is not None:
                    continue
                members = groups[group] = []
            members.append(i)
    shared = {members[0]: (batched[sha], members) for (sha, *_), members in groups.items() if len(members) > 1}
    if not shared:
        return list(calls), None
    carried = {i for _, members in shared.values() for i in members}
    written: list[ScriptCall] = []
    spans: list[Span] = []
    for i, (script, keys, args) in enumerate(calls):
        group = shared.get(i)
        if group is not None:
            many, members = group
            for start in range(0, len(members), MAX_PER_BATCH_CALL):
                chunk = tuple(members[start : start + MAX_PER_BATCH_CALL])
                packed: list[Any] = [len(args)]
                for j in chunk:
                    packed.extend(calls[j][2])
                written.append((many, keys, packed))
                spans.append(chunk)
        elif i not in carried:
            written.append((script, keys, args))
            spans.append(i)
    return written, spans


def spread(wire_replies: Sequence[Any], spans: Sequence[Span], count: int) -> list[Any]:
    """One reply per call given to ``coalesce``, from the replies of the calls written: a ``prepare_halves`` or
    ``end_transactions`` call's list gives each prepare or end its own reply (or its own error); an error of the
    whole call (refused before it ran, e.g. out of memory) is each of its calls' error."""
    replies: list[Any] = [None] * count
    for span, reply in zip(spans, wire_replies, strict=True):
        if isinstance(span, int):
            replies[span] = reply
        elif isinstance(reply, Exception):
            for i in span:
                replies[i] = reply
        elif isinstance(reply, list) and len(reply) == len(span):
            for i, one in zip(span, reply, strict=True):
                replies[i] = one
        else:
            wrong = redis.ResponseError(f"a batch call replied {reply!r} to {len(span)} calls")
            for i in span:
                replies[i] = wrong
    return replies
