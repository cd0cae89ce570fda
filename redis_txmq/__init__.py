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
