"""The transaction log on Redis: every state change of a transaction is one call of one Lua script.

Producer, checker and operator commands all end transactions through ``AsyncRedisBroker.end_transaction``
(``lua/end_transaction.lua``; ``apply_end`` is the same call for an ``EndCall`` in hand), so there is one commit path to
read and to trust. This is the I/O shell: what is sent and how replies are read lives in ``redis_txmq.core.protocol``.
The asyncio broker's module is the source; the sync one's (``redis_txmq/sync/broker.py``, used by the checker and the
operator commands too) is generated from it by ``scripts/unasync.py``. The send path's calls go through a script runner
of the wire (``direct`` for the sync broker, ``lane`` for the asyncio one), which writes a durability level's
confirmation with them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..core import protocol
from ..core.clients import REDIS_ERRORS, connection_errors, is_cluster
from ..core.config import Settings
from ..core.durability import check_servers, durability_unchecked
from ..core.errors import DurabilityError, TxMQConnectionError, TxMQError
from ..core.keys import SCHEDULE, TOPIC_REGISTRY, TopicKeys, decision_key
from ..core.message import LocalTransactionState, Message
from ..core.protocol import (
    ClaimResult,
    DeadAction,
    DueCheck,
    EndCall,
    EndResult,
    EndSource,
    NotedRequests,
    PrepareResult,
    RecordAction,
    SentCheck,
    TransactionRecord,
)
from ..core.scripts import register_script, register_topic_script
from ..transport.connection import async_server_info, async_server_nodes
from ..transport.synchronization import AsyncLock
from .lane import AsyncScriptRunner
from .preload import preload

# sync-only: from .wire import run_scripts

__all__ = [
    "AsyncRedisBroker",
    "ClaimResult",
    "DeadAction",
    "DueCheck",
    "EndCall",
    "EndResult",
    "EndSource",
    "PrepareResult",
]
"""The result types live in ``redis_txmq.core.protocol``; they are importable from here too."""

logger = logging.getLogger(__name__)


class AsyncRedisBroker:
    """Calls the transaction scripts on one client (``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``)."""

    def __init__(self, client: Any, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or Settings()
        self._prepare = register_topic_script(client, "prepare_half")
        self._end = register_topic_script(client, "end_transaction")
        self._claim_checks = register_topic_script(client, "claim_checks")
        self._sweep_half = register_topic_script(client, "sweep_half")
        self._dead_resolve = register_topic_script(client, "dead_resolve")
        self._bury_half = register_topic_script(client, "bury_half")
        self._note_requests = register_topic_script(client, "note_requests")
        self._decide = register_script(client, "decide_transaction")
        self._due_topics = register_script(client, "due_topics")
        self._schedule_topics = register_script(client, "schedule_topics")
        self._registered: set[str] = set()
        self._registry_lock = AsyncLock()
        self._wake_in_script = not is_cluster(client)
        """One server: the scripts that wake a topic write the checkers' schedule themselves (``KEYS[14]``)."""
        self.durability = self.settings.durability_level()
        self.runner = AsyncScriptRunner(client, durability=self.durability)  # async-only
        # sync-only: self.runner = ScriptRunner(client, run_scripts, durability=self.durability)

    async def close(self) -> None:
        """Close the connections of the send path's runner (the client itself stays open)."""
        await self.runner.close()

    async def load_scripts(self) -> None:
        """Load the scripts into Redis; raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] when
        Redis cannot be reached."""
        try:
            await preload(
                self._prepare,
                self._end,
                self._claim_checks,
                self._sweep_half,
                self._dead_resolve,
                self._bury_half,
                self._note_requests,
                self._decide,
                self._due_topics,
                self._schedule_topics,
            )
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"could not load the transaction scripts into Redis: {exc}") from exc
        await self.check_durability()

    async def check_durability(self) -> None:
        """Refuse a durability level the server cannot give (``aof`` before Redis 7.2 or without an append-only
        file), at start rather than on every send; warn when fewer replicas than asked are connected now. A cluster
        master that cannot be reached is skipped with a warning (one master down must not stop a producer or a checker
        from serving the others); raises [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError] only when
        no server answered."""
        if self.durability is None:
            return
        try:
            nodes = await async_server_nodes(self.client)
        except REDIS_ERRORS as exc:
            raise durability_unchecked(self.durability, exc) from exc
        answers: list[tuple[str, dict[str, Any] | Exception]] = []
        for address, node in nodes:
            try:
                answers.append((address, await async_server_info(node, "server", "replication", "persistence")))
            except REDIS_ERRORS as exc:
                answers.append((address, exc))
        check_servers(self.durability, answers)

    def registered_streams(self) -> frozenset[str]:
        """The topic streams this process registered: re-asserted with the heartbeat, so the registry heals
        after Redis lost its data."""
        return frozenset(self._registered)

    async def register_topic(self, keys: TopicKeys, message: Message, transaction_id: str) -> None:
        """Add the topic stream to the registry the checker walks, once per process and stream, after checking
        that its key is free or a stream (the prepare script does not check it)."""
        stream = keys.topic_stream
        if stream in self._registered:
            return
        async with self._registry_lock:
            if stream not in self._registered:
                with connection_errors():
                    protocol.refuse_topic_key(await self.client.type(stream), keys, message, transaction_id)
                    await self.client.sadd(TOPIC_REGISTRY, stream)
                self._registered.add(stream)

    async def prepare_half(
        self,
        keys: TopicKeys,
        message: Message,
        transaction_id: str,
        producer_group: str,
        parent_transaction_id: str = "",
    ) -> PrepareResult:
        """Write the half message (``lua/prepare_half.lua``); safe to retry with the same transaction id."""
        args = protocol.prepare_args(message, transaction_id, producer_group, keys, parent_transaction_id)
        try:
            if keys.topic_stream not in self._registered:  # once per stream: no call (on asyncio no coroutine) after
                await self.register_topic(keys, message, transaction_id)
            reply = await self.runner.run(self._prepare, self._wake_keys(keys), args)
        except DurabilityError as exc:
            # a refusal says more than a shortfall; a prepare that ran is in flight and its topic awake either way
            unconfirmed = protocol.prepare_result(exc.replies[0], message, transaction_id)
            await self._wake(keys, unconfirmed.wake, transaction_id)
            raise protocol.prepare_not_durable(exc, message, transaction_id) from exc
        except REDIS_ERRORS as exc:
            raise protocol.prepare_call_error(exc, message, transaction_id) from exc
        result = protocol.prepare_result(reply, message, transaction_id)
        if result.wake:
            await self._wake(keys, result.wake, transaction_id)
        return result

    def _wake_keys(self, keys: TopicKeys) -> list[str]:
        return keys.scheduled_script_keys() if self._wake_in_script else keys.script_keys()

    async def _wake(self, keys: TopicKeys, score: str, transaction_id: str) -> None:
        """Wake the topic in the checkers' schedule (``SCHEDULE``) where the script could not
        (Cluster: another hash slot), after the script ran, scored at the script's time: a look made after the
        script sees the transaction; one made before it is older than that score, and its write to the schedule
        keeps it (``lua/schedule_topics.lua``). Not written (Redis unreachable, the process gone), a checker's full
        pass over every topic finds the transaction (``full_pass_interval``)."""
        if not score:
            return
        try:
            await self.client.zadd(SCHEDULE, {keys.topic_stream: int(score)})
        except REDIS_ERRORS as exc:
            logger.warning(
                "tx=%s topic=%s: the checkers' schedule %s was not told about %s (%s); the transaction's check-back "
                "waits for a checker's next full pass",
                transaction_id,
                keys.topic,
                SCHEDULE,
                keys.topic_stream,
                exc,
            )

    async def end_transaction(
        self,
        keys: TopicKeys,
        transaction_id: str,
        producer_group: str,
        outcome: LocalTransactionState,
        *,
        source: EndSource,
        remark: str | None = None,
        half_id: str | None = None,
    ) -> EndResult:
        """Apply COMMIT / ROLLBACK (or record the remark of UNKNOWN) in one atomic script call."""
        return await self.apply_end(EndCall(keys, transaction_id, producer_group, outcome, source, remark, half_id))

    async def apply_end(self, end: EndCall) -> EndResult:
        """``end_transaction`` of an end already made (a producer's send has its ``EndCall`` in hand)."""
        keys, transaction_id = end.keys, end.transaction_id
        try:
            reply = await self.runner.run(self._end, keys.script_keys(), protocol.end_args(end, self.settings))
        except DurabilityError as exc:
            protocol.end_result(exc.replies[0], keys, transaction_id)  # a refusal says more than a shortfall
            raise protocol.end_not_durable(exc, keys, transaction_id, end.outcome) from exc
        except REDIS_ERRORS as exc:
            raise protocol.end_call_error(exc, keys, transaction_id) from exc
        result = protocol.end_result(reply, keys, transaction_id)
        if result.check_request:
            await self.drop_check_requests([(end.producer_group, result.check_request)])
        return result

    async def decide(
        self,
        transaction_id: str,
        producer_group: str,
        action: LocalTransactionState | RecordAction,
        source: EndSource,
        indices: Iterable[int] = (),
        *,
        unconfirmed_ok: bool = False,
    ) -> TransactionRecord:
        """Write to the record of a transaction of several messages (``lua/decide_transaction.lua``): its decision,
        written once (COMMIT / ROLLBACK, with the indices of the sends that did not return), or the sends that did
        not return (VOID), or its dead-lettered messages (PIN / UNPIN); returns the record as it stands.
        ``unconfirmed_ok``: a durability shortfall returns the record as the master holds it (logged) instead of
        raising, for a caller whose next steps are safe to take on it (ending the messages with a decision)."""
        args = protocol.decide_args(transaction_id, producer_group, action, source, self.settings, indices)
        try:
            reply = await self.runner.run(self._decide, [decision_key(transaction_id)], args)
        except DurabilityError as exc:
            record = protocol.record_result(exc.replies[0], transaction_id)
            if not unconfirmed_ok:
                raise
            protocol.decision_not_durable(transaction_id, exc)
            return record
        except REDIS_ERRORS as exc:
            raise protocol.decide_call_error(exc, transaction_id) from exc
        return protocol.record_result(reply, transaction_id)

    async def decisions(self, transaction_ids: list[str]) -> dict[str, TransactionRecord]:
        """The records of these transactions of several messages (an undecided one has ``outcome`` None)."""
        if not transaction_ids:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for transaction_id in transaction_ids:
                pipe.hmget(decision_key(transaction_id), "outcome", "voided", "producer_group")
            replies = await pipe.execute()
        return protocol.records_read(transaction_ids, replies)

    async def end_transactions(self, ends: list[EndCall]) -> list[EndResult | TxMQError]:
        """Apply many ends at once (a one-way producer's flusher, a checker's batch of answers, the messages of a
        transaction of several); each script stays atomic.

        Returns, in order, the ``EndResult`` or the [`TxMQError`][redis_txmq.core.errors.TxMQError] of each end; a
        connection failure of the whole batch is raised as
        [`TxMQConnectionError`][redis_txmq.core.errors.TxMQConnectionError]."""
        calls = [(self._end, end.keys.script_keys(), protocol.end_args(end, self.settings)) for end in ends]
        try:
            replies = await self.runner.run_many(calls)
        except DurabilityError as exc:
            protocol.batch_not_durable(len(ends), exc)
            replies = exc.replies
        except REDIS_ERRORS as exc:
            raise protocol.batch_error(len(ends), exc) from exc
        results = protocol.end_results(ends, replies)
        await self.drop_check_requests(protocol.retired_requests(ends, results))
        return results

    async def drop_check_requests(self, requests: list[tuple[str, str]]) -> None:
        """Delete check requests ``(producer group, request id)`` whose transaction ended or was dead-lettered.

        Best effort: a request left behind is answered by a producer and applied as a repeat, or found stale by
        the checker's next claim of the same transaction (which deletes it)."""
        if not requests:
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:  # gives the connection back on errors
                protocol.queue_drop_check_requests(pipe, requests)
                await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            logger.warning("could not delete %d answered check requests: %s", len(requests), exc)

    async def note_check_requests(self, keys: TopicKeys, sent: list[SentCheck]) -> NotedRequests:
        """Remember the check requests just sent and give back the checks of the requests they replaced that no
        producer instance read (``lua/note_requests.lua``); returns the ids of requests whose transaction ended
        meanwhile (the caller deletes them) and how many checks were given back."""
        reply = await self._call(self._note_requests, keys, protocol.note_requests_args(sent), "note check requests")
        return protocol.note_requests_result(reply, keys)

    async def resolve_dead(
        self, keys: TopicKeys, transaction_id: str, action: DeadAction, remark: str = ""
    ) -> EndResult:
        """Commit, roll back or re-check a dead-lettered transaction (``lua/dead_resolve.lua``)."""
        args = protocol.dead_resolve_args(transaction_id, action, remark, self.settings)
        what = f"dead-letter {action.value}"
        reply = await self._call(self._dead_resolve, keys, args, what, transaction_id, wake=True)
        result = protocol.end_result(reply, keys, transaction_id)
        if DeadAction(action) is DeadAction.RECHECK and result.applied:
            await self._wake(keys, protocol.recheck_wake(reply), transaction_id)
        return result

    async def claim_checks(self, keys: TopicKeys, limit: int) -> ClaimResult:
        """Claim up to ``limit`` transactions due for a check-back (``lua/claim_checks.lua``)."""
        reply = await self._call(self._claim_checks, keys, protocol.claim_args(self.settings, limit), "claim checks")
        return protocol.claim_result(reply, keys)

    async def due_topics(self, limit: int) -> tuple[str, list[str]]:
        """``(server time in ms, the topic streams due by then)`` of the checkers' schedule (``lua/due_topics.lua``),
        at most ``limit``, earliest first."""
        try:
            reply = await self._due_topics(keys=[SCHEDULE], args=[limit])
        except REDIS_ERRORS as exc:
            raise protocol.schedule_call_error(exc, "read") from exc
        return protocol.due_topics_result(reply)

    async def schedule_topics(self, looks: list[tuple[str, str, str]]) -> None:
        """Write ``(topic stream, seen_ms, next_ms)`` of the topics just looked at to the checkers' schedule
        (``lua/schedule_topics.lua``), in calls of up to 1,000."""
        for start in range(0, len(looks), 1000):
            args = [value for look in looks[start : start + 1000] for value in look]
            try:
                reply = await self._schedule_topics(keys=[SCHEDULE], args=args)
            except REDIS_ERRORS as exc:
                raise protocol.schedule_call_error(exc, "write") from exc
            protocol.schedule_result(reply)

    async def bury_half(
        self, keys: TopicKeys, transaction_id: str, half_id: str, reason: str, producer_group: str
    ) -> str:
        """Dead-letter one in-flight transaction (``lua/bury_half.lua``) if it still is half message ``half_id``;
        returns the dead letter's id ('' when it was not)."""
        args = [transaction_id, half_id, reason]
        reply = await self._call(self._bury_half, keys, args, "dead-letter", transaction_id)
        dead_id, request_id = protocol.bury_result(reply, keys)
        if request_id:
            await self.drop_check_requests([(producer_group, request_id)])
        return dead_id

    async def sweep_half(self, keys: TopicKeys, cursor: str, count: int) -> tuple[str, list[tuple[str, str]]]:
        """Dead-letter half entries that no transaction owns; returns the next cursor ('0-0' at the end)."""
        reply = await self._call(self._sweep_half, keys, [cursor, count], "sweep half stream")
        return protocol.sweep_result(reply)

    async def _call(
        self, script: Any, keys: TopicKeys, args: list[Any], what: str, transaction_id: str = "", wake: bool = False
    ) -> Any:
        try:
            return await script(keys=self._wake_keys(keys) if wake else keys.script_keys(), args=args)
        except REDIS_ERRORS as exc:
            raise protocol.script_call_error(exc, keys, what, transaction_id) from exc
