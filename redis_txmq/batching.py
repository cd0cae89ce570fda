"""Prepares, or ends, of one topic partition written together go as one call of their batch script.

Whatever writes several script calls at once — the asyncio lane (``redis_txmq/asyncio/lane.py``) and the sync
runner's pipelines (:class:`redis_txmq.direct.ScriptRunner`: a one-way producer's flusher, a checker's batch of
answers, the messages of a transaction of several) — hands its calls to :func:`coalesce`: the ``prepare_half`` /
``end_transaction`` calls that share KEYS (one topic partition) and their number of arguments become
``prepare_halves`` / ``end_transactions`` calls (``lua/``), which apply the same rules to each in turn, one reply
each, and read and write the indexes once for all of them. :func:`spread` gives every call its own reply back. One
script invocation per batch instead of one per call is what the server saves; every prepare and every end is
idempotent, so a repeat of the batch (a connection error, NOSCRIPT) applies none twice.
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
    script of ``batched`` (its digest -> its batch script) that share KEYS and their number of arguments become
    calls of the batch script, up to :data:`MAX_PER_BATCH_CALL` each, at the place of the first of them; the rest go
    as they are."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    if batched:
        for i, (script, keys, args) in enumerate(calls):
            if script.sha in batched:
                groups.setdefault((script.sha, len(args), *keys), []).append(i)
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
    """One reply per call given to :func:`coalesce`, from the replies of the calls written: a ``prepare_halves`` or
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
