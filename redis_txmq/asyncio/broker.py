"""The transaction scripts on a ``redis.asyncio`` client: the asyncio I/O shell of :mod:`redis_txmq.protocol`.

The same scripts and the same arguments, replies and errors as :class:`redis_txmq.broker.RedisBroker`; calls go
through redis-py's ``AsyncScript`` (EVALSHA with the NOSCRIPT fallback) and its pipelines.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import protocol
from ..config import Settings
from ..connection import REDIS_ERRORS, is_async_cluster
from ..errors import TxMQConnectionError, TxMQError
from ..keys import TOPIC_REGISTRY, TopicKeys
from ..message import LocalTransactionState, Message
from ..protocol import EndCall, EndResult, EndSource, PrepareResult
from ..scripts import register_topic_script
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
        self._cluster = is_async_cluster(client)
        self._registered: set[str] = set()
        self._lane = None if self._cluster else ScriptLane(client)

    async def _run(self, script: Any, keys: TopicKeys, args: list[Any]) -> Any:
        """One script call: through the lane that pipelines concurrent calls, or directly on a cluster."""
        if self._lane is None:
            return await script(keys=keys.script_keys(), args=args)
        return await self._lane.call(script, keys.script_keys(), args)

    async def load_scripts(self) -> None:
        """Load the scripts into Redis; raises :class:`TxMQConnectionError` when Redis cannot be reached."""
        try:
            await preload(self._prepare, self._end)
        except REDIS_ERRORS as exc:
            raise TxMQConnectionError(f"could not load the transaction scripts into Redis: {exc}") from exc

    def registered_streams(self) -> frozenset[str]:
        return frozenset(self._registered)

    async def register_topic(self, keys: TopicKeys) -> None:
        """Add the topic stream to the registry the checker walks; once per process and stream (two sends racing
        to register it both write it: the set does not mind)."""
        stream = keys.topic_stream
        if stream not in self._registered:
            await self.client.sadd(TOPIC_REGISTRY, stream)
            self._registered.add(stream)

    async def prepare_half(
        self, keys: TopicKeys, message: Message, transaction_id: str, producer_group: str
    ) -> PrepareResult:
        """Write the half message (``lua/prepare_half.lua``); safe to retry with the same transaction id."""
        args = protocol.prepare_args(message, transaction_id, producer_group, keys)
        try:
            await self.register_topic(keys)
            reply = await self._run(self._prepare, keys, args)
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
        except REDIS_ERRORS as exc:
            raise protocol.end_call_error(exc, keys, transaction_id) from exc
        result = protocol.end_result(reply, keys, transaction_id)
        if result.check_request:
            await self.drop_check_requests([(producer_group, result.check_request)])
        return result

    async def end_transactions(self, ends: list[EndCall]) -> list[EndResult | TxMQError]:
        """Apply many ends in one pipeline (each script still atomic); on a cluster, whose pipelines refuse
        EVALSHA, as concurrent calls. A connection failure of the whole batch raises :class:`TxMQConnectionError`."""
        try:
            if self._cluster:
                calls = [self._end(keys=e.keys.script_keys(), args=protocol.end_args(e, self.settings)) for e in ends]
                replies = list(await asyncio.gather(*calls, return_exceptions=True))
                for reply in replies:
                    if isinstance(reply, BaseException) and not isinstance(reply, REDIS_ERRORS):
                        raise reply
            else:
                async with self.client.pipeline(transaction=False) as pipe:  # gives the connection back on errors
                    for end in ends:
                        args = protocol.end_args(end, self.settings)
                        await self._end(keys=end.keys.script_keys(), args=args, client=pipe)
                    replies = await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            raise protocol.batch_error(len(ends), exc) from exc
        results = protocol.end_results(ends, replies)
        await self.drop_check_requests(protocol.retired_requests(ends, results))
        return results

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
