"""redis-txmq: RocketMQ-style transactional messages on Redis Streams."""

from .config import Settings
from .consumer import Consumer
from .entries import ConsumedMessage
from .errors import (
    ConfigurationError,
    CorruptEntryError,
    DelayNotSupportedError,
    DurabilityError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicError,
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
)
from .listener import TransactionListener
from .message import LocalTransactionState, Message, SendStatus, TransactionSendResult
from .producer import TransactionProducer
from .topics import create_topic, partition_count
from .transaction import Transaction

__version__ = "0.1.0"

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
    "LocalTransactionState",
    "Message",
    "MessageTooLargeError",
    "PrepareError",
    "ProducerGroupMismatchError",
    "ProducerStateError",
    "ReservedPropertyError",
    "SendStatus",
    "Settings",
    "TransactionConflictError",
    "TransactionDeadLetteredError",
    "Transaction",
    "TransactionError",
    "TransactionListener",
    "TransactionNotFoundError",
    "TransactionProducer",
    "TransactionSendResult",
    "TxMQConnectionError",
    "TxMQError",
    "__version__",
    "create_topic",
    "partition_count",
]
