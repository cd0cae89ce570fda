"""The transaction scripts on a ``redis.asyncio`` client: the asyncio I/O shell of :mod:`redis_txmq.protocol`.

The same scripts and the same arguments, replies and errors as :class:`redis_txmq.broker.RedisBroker`; calls go
through redis-py's ``AsyncScript`` (EVALSHA with the NOSCRIPT fallback) and its pipelines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import redis
from redis.exceptions import NoScriptError

from .. import protocol
from ..config import Settings
from ..connection import REDIRECTIONS, REDIS_ERRORS, is_async_cluster
from ..durability import check_servers, durability_unchecked
from ..errors import DurabilityError, TxMQConnectionError, TxMQError
from ..keys import TOPIC_REGISTRY, TopicKeys, decision_key
from ..message import LocalTransactionState, Message
from ..protocol import EndCall, EndResult, EndSource, PrepareResult, RecordAction, TransactionRecord
from ..scripts import register_script, register_topic_script
from .lane import ScriptLane
from .scripts import preload

logger = logging.getLogger(__name__)


class AsyncRedisBroker:
    """Calls the send path's scripts (prepare, end) on a ``redis.asyncio.Redis`` or ``RedisCluster``."""

    def __init__(self, client: Any, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or Settings()
        self._prepare = register_topic_script(client, "prepare_half")
        self._end = register_topic_script(client, "end_transaction")
        self._decide = register_script(client, "decide_transaction")
        self._cluster = is_async_cluster(client)
        self.durability = self.settings.durability_level()
        self._registered: set[str] = set()
        self._lane = None if self._cluster else ScriptLane(client, durability=self.durability)

    async def _run(self, script: Any, keys: TopicKeys, args: list[Any]) -> Any:
        """One script call: through the lane that pipelines concurrent calls, or directly on a cluster."""
        return await self._run_keys(script, keys.script_keys(), args)

    async def _run_keys(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        if self._lane is None:
            if self.durability is not None:
                return await self._run_on_master(script, keys, args)
            return await script(keys=keys, args=args)
        return await self._lane.call(script, keys, args)

    async def _run_on_master(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """On a cluster with a durability level: the script and its confirmation in one write on one connection of
        the master that owns the slot. A redirection or an unreachable master sends the call through the cluster
        client (which follows MOVED and refreshes its map); such a call cannot be confirmed (DurabilityError)."""
        from redis.asyncio.cluster import PipelineCommand

        durability = self.durability
        assert durability is not None
        try:
            node = self.client.get_node_from_key(keys[0])
            for _attempt in range(2):
                calls = [
                    PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args),
                    PipelineCommand(1, *durability.command),
                ]
                await node.execute_pipeline(calls)
                reply, confirmation = calls[0].result, calls[1].result
                if not isinstance(reply, NoScriptError):
                    break
                await self.client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
        except (*REDIS_ERRORS,) as exc:
            if isinstance(exc, redis.ResponseError) and not isinstance(exc, REDIRECTIONS):
                raise
            reply, confirmation = await script(keys=keys, args=args), None
        if isinstance(reply, REDIRECTIONS):
            reply, confirmation = await script(keys=keys, args=args), None
        if isinstance(reply, Exception):
            raise reply
        if not durability.confirmed(confirmation):
            raise durability.error(confirmation, [reply])
        return reply

    async def load_scripts(self) -> None:
        """Load the scripts into Redis; raises :class:`TxMQConnectionError` when Redis cannot be reached."""
        try:
            await preload(self._prepare, self._end, self._decide)
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"could not load the transaction scripts into Redis: {exc}") from exc
        await self.check_durability()

    async def check_durability(self) -> None:
        """Refuse a durability level the server cannot give, at start; warn when fewer replicas than asked are
        connected now. A cluster master that cannot be reached is skipped with a warning; raises
        :class:`TxMQConnectionError` only when no server answered (as :meth:`RedisBroker.check_durability`).
        A cluster client learns its masters on its first command: it is initialized first, or none would be checked."""
        if self.durability is None:
            return
        if self._cluster:
            try:
                await self.client.initialize()
            except REDIS_ERRORS as exc:
                raise durability_unchecked(self.durability, exc) from exc
        answers: list[tuple[str, dict[str, Any] | Exception]] = []
        for node in self.client.get_primaries() if self._cluster else [None]:
            address, options = ("the server", {}) if node is None else (node.name, {"target_nodes": node})
            info: dict[str, Any] = {}
            try:
                for section in ("server", "replication", "persistence"):
                    info.update(await self.client.info(section, **options))
            except redis.ResponseError:
                info = {}  # a user without INFO: check_server says the level could not be checked
            except REDIS_ERRORS as exc:
                answers.append((address, exc))
                continue
            answers.append((address, info))
        check_servers(self.durability, answers)

    def registered_streams(self) -> frozenset[str]:
        return frozenset(self._registered)

    async def register_topic(self, keys: TopicKeys, message: Message, transaction_id: str) -> None:
        """Add the topic stream to the registry the checker walks, once per process and stream, after checking
        that its key is free or a stream (two sends racing to register it both write it: the set does not mind)."""
        stream = keys.topic_stream
        if stream not in self._registered:
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
            await self.register_topic(keys, message, transaction_id)
            reply = await self._run(self._prepare, keys, args)
        except DurabilityError as exc:
            protocol.prepare_result(exc.replies[0], message, transaction_id)  # a refusal says more than a shortfall
            raise protocol.prepare_not_durable(exc, message, transaction_id) from exc
        except REDIS_ERRORS as exc:
            raise protocol.prepare_call_error(exc, message, transaction_id) from exc
        return protocol.prepare_result(reply, message, transaction_id)

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
        end = EndCall(keys, transaction_id, producer_group, outcome, source, remark, half_id)
        try:
            reply = await self._run(self._end, keys, protocol.end_args(end, self.settings))
        except DurabilityError as exc:
            protocol.end_result(exc.replies[0], keys, transaction_id)  # a refusal says more than a shortfall
            raise protocol.end_not_durable(exc, keys, transaction_id, outcome) from exc
        except REDIS_ERRORS as exc:
            raise protocol.end_call_error(exc, keys, transaction_id) from exc
        result = protocol.end_result(reply, keys, transaction_id)
        if result.check_request:
            await self.drop_check_requests([(producer_group, result.check_request)])
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
        """Write to the record of a transaction of several messages (see the sync broker)."""
        args = protocol.decide_args(transaction_id, producer_group, action, source, self.settings, indices)
        try:
            reply = await self._run_keys(self._decide, [decision_key(transaction_id)], args)
        except DurabilityError as exc:
            record = protocol.record_result(exc.replies[0], transaction_id)
            if not unconfirmed_ok:
                raise
            protocol.decision_not_durable(transaction_id, exc)
            return record
        except REDIS_ERRORS as exc:
            raise protocol.decide_call_error(exc, transaction_id) from exc
        return protocol.record_result(reply, transaction_id)

    async def end_transactions(self, ends: list[EndCall]) -> list[EndResult | TxMQError]:
        """Apply many ends in one pipeline (each script still atomic); on a cluster, whose pipelines refuse
        EVALSHA, as concurrent calls. A connection failure of the whole batch raises :class:`TxMQConnectionError`."""
        try:
            if self._cluster:
                calls = [self._run_unconfirmed_ok(e.keys, protocol.end_args(e, self.settings)) for e in ends]
                replies = list(await asyncio.gather(*calls, return_exceptions=True))
                for reply in replies:
                    if isinstance(reply, BaseException) and not isinstance(reply, REDIS_ERRORS):
                        raise reply
            else:
                async with self.client.pipeline(transaction=False) as pipe:  # gives the connection back on errors
                    for end in ends:
                        args = protocol.end_args(end, self.settings)
                        await self._end(keys=end.keys.script_keys(), args=args, client=pipe)
                    if self.durability is not None:
                        pipe.execute_command(*self.durability.command)
                    replies = await pipe.execute(raise_on_error=False)
                if self.durability is not None:
                    confirmation = replies.pop()
                    if not self.durability.confirmed(confirmation):
                        protocol.batch_not_durable(len(ends), self.durability.error(confirmation))
        except REDIS_ERRORS as exc:
            raise protocol.batch_error(len(ends), exc) from exc
        results = protocol.end_results(ends, replies)
        await self.drop_check_requests(protocol.retired_requests(ends, results))
        return results

    async def _run_unconfirmed_ok(self, keys: TopicKeys, args: list[Any]) -> Any:
        """An end of a batch on a cluster: its reply, a shortfall of its confirmation only logged (as for a batch on
        one server: the check-back repairs an end a failover loses)."""
        try:
            return await self._run(self._end, keys, args)
        except DurabilityError as exc:
            protocol.batch_not_durable(1, exc)
            return exc.replies[0]

    async def drop_check_requests(self, requests: list[tuple[str, str]]) -> None:
        """Delete check requests whose transaction ended (best effort, as the sync broker)."""
        if not requests:
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                protocol.queue_drop_check_requests(pipe, requests)
                await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            logger.warning("could not delete %d answered check requests: %s", len(requests), exc)
