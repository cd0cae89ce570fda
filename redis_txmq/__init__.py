"""redis-txmq: RocketMQ-style transactional messages on Redis Streams.

The public names, re-exported from where they live: ``core/`` the protocol without I/O, ``sync/`` the sync shells
(generated from ``asyncio/``), ``transport/`` connections; ``docs/contributing.md`` has the map of the folders."""

import importlib
from pathlib import Path
from types import ModuleType

from . import _moved, _source_tree
from .core.config import Settings
from .core.entries import ConsumedMessage
from .core.errors import (
    ConfigurationError,
    CorruptEntryError,
    DelayNotSupportedError,
    DurabilityError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicError,
    JobNotCommittedError,
    MessageTooLargeError,
    PrepareError,
    ProducerGroupMismatchError,
    ProducerStateError,
    ReservedPropertyError,
    TransactionConflictError,
    TransactionDeadLetteredError,
    TransactionError,
    TransactionNotFoundError,
    TxMQConnectionError,
    TxMQError,
    UnpublishableJobError,
    WriteJobError,
)
from .core.listener import TransactionListener
from .core.message import LocalTransactionState, Message, SendStatus, TransactionSendResult
from .core.topics import create_topic, partition_count
from .sync.consumer import Consumer
from .sync.producer import TransactionProducer
from .sync.transaction import Transaction

__version__ = "0.2.0"

_moved.install()
_source_tree.install(Path(__file__).resolve().parent)


def __getattr__(name: str) -> ModuleType:
    """``redis_txmq.producer`` and the other module paths that moved in 0.2.0, with a DeprecationWarning."""
    if f"{__name__}.{name}" in _moved.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigurationError",
    "ConsumedMessage",
    "Consumer",
    "CorruptEntryError",
    "DelayNotSupportedError",
    "DurabilityError",
    "InvalidMessageError",
    "InvalidPropertyError",
    "InvalidTopicError",
    "JobNotCommittedError",
    "LocalTransactionState",
    "Message",
    "MessageTooLargeError",
    "PrepareError",
    "ProducerGroupMismatchError",
    "ProducerStateError",
    "ReservedPropertyError",
    "SendStatus",
    "Settings",
    "Transaction",
    "TransactionConflictError",
    "TransactionDeadLetteredError",
    "TransactionError",
    "TransactionListener",
    "TransactionNotFoundError",
    "TransactionProducer",
    "TransactionSendResult",
    "TxMQConnectionError",
    "TxMQError",
    "UnpublishableJobError",
    "WriteJobError",
    "__version__",
    "create_topic",
    "partition_count",
]
