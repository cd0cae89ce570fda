"""Data sources for the tests of a Spark write job whose driver fails after its tasks wrote: ``redis-txmq``'s writer
with a ``commit`` that fails before deciding, or that dies right after writing the decision (the Python process
that runs the driver's commit exits: the job fails and Spark calls ``abort``); and a streaming sink whose commit
raises right after deciding (a durability shortfall, a dropped connection): Spark calls ``abort`` for that
micro-batch."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql.types import StructType

from redis_txmq import LocalTransactionState
from redis_txmq.spark.source import RedisTxmqDataSource
from redis_txmq.spark.writer import BatchWriter, StreamWriter, WriteOptions, _staged, parse_write_options


class _FailingCommit(BatchWriter):
    def __init__(self, options: WriteOptions, after_decision: bool) -> None:
        super().__init__(options)
        self.after_decision = after_decision

    def commit(self, messages: list[Any]) -> None:
        if not self.after_decision:
            raise RuntimeError("the driver failed before deciding")
        self._settle(lambda job: job.decide(LocalTransactionState.COMMIT, _staged(messages)))
        os._exit(3)


class CommitFailsBeforeDeciding(RedisTxmqDataSource):
    @classmethod
    def name(cls) -> str:
        return "redis-txmq-commit-fails"

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        return _FailingCommit(parse_write_options(self.options, schema, streaming=False), after_decision=False)


class CommitDiesAfterDeciding(RedisTxmqDataSource):
    @classmethod
    def name(cls) -> str:
        return "redis-txmq-commit-dies"

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        return _FailingCommit(parse_write_options(self.options, schema, streaming=False), after_decision=True)


class _CommitRaisesAfterDeciding(StreamWriter):
    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        self._settle(batchId, lambda job: job.decide(LocalTransactionState.COMMIT, _staged(messages)))
        raise RuntimeError("the connection dropped after the sink decided")


class StreamCommitRaisesAfterDeciding(RedisTxmqDataSource):
    @classmethod
    def name(cls) -> str:
        return "redis-txmq-stream-commit-raises"

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:  # noqa: N802 - Spark's name
        return _CommitRaisesAfterDeciding(parse_write_options(self.options, schema, streaming=True))
