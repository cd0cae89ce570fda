"""One exception hierarchy: every error this library raises is a [`TxMQError`][redis_txmq.core.errors.TxMQError].

Messages name the topic and transaction id where there is one, and say what to do next. Validation errors also derive
from ``ValueError`` so generic callers can catch them.
"""

from __future__ import annotations


class TxMQError(Exception):
    """Base class of every redis-txmq error."""


class InvalidMessageError(TxMQError, ValueError):
    """A message (or one of its parts) was refused before anything was written to Redis."""


class InvalidTopicError(InvalidMessageError):
    """The topic name does not match ``^[A-Za-z0-9][A-Za-z0-9_.:-]{0,126}$``."""


class MessageTooLargeError(InvalidMessageError):
    """The body is larger than ``max_message_size``."""


class InvalidPropertyError(InvalidMessageError):
    """A property name or value is not a non-empty ``str`` → ``str`` pair."""


class ReservedPropertyError(InvalidPropertyError):
    """A property uses a name the library or RocketMQ reserves for itself."""


class DelayNotSupportedError(InvalidMessageError):
    """Transactional messages cannot be delayed (RocketMQ clears the delay; we refuse it)."""


class ConfigurationError(TxMQError, ValueError):
    """A setting, group name or constructor argument is invalid."""


class ProducerStateError(TxMQError):
    """The producer is not started, or already shut down."""


class TxMQConnectionError(TxMQError):
    """Redis could not be reached or answered with an error the library cannot interpret."""


class PrepareError(TxMQConnectionError):
    """The half message could not be written; the local transaction was not run."""


class DurabilityError(TxMQConnectionError):
    """The master applied a write, but it was not confirmed as durable as the durability level asks, in time
    (fewer replicas than asked had it, or the append-only file was not fsynced). ``replies`` holds what the
    scripts answered: the writes happened on the master, they may be lost by a failover."""

    def __init__(self, message: str, *, replies: list[object] | None = None) -> None:
        super().__init__(message)
        self.replies = replies or []


class TransactionError(TxMQError):
    """An end call was refused by the end script: the transaction state did not allow it."""

    def __init__(self, message: str, *, topic: str, transaction_id: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.transaction_id = transaction_id


class TransactionNotFoundError(TransactionError):
    """No in-flight, recently ended or dead-lettered transaction has this id on this topic."""


class TransactionConflictError(TransactionError):
    """The transaction already ended with the other outcome; an end decides once."""


class ProducerGroupMismatchError(TransactionError):
    """The end call names another producer group than the half message (RocketMQ's checkPrepareMessage)."""


class TransactionDeadLetteredError(TransactionError):
    """The transaction was moved to the dead-letter stream; an operator resolves it from there."""


class CorruptEntryError(TxMQError):
    """A stream entry lacks fields this library writes; another tool probably wrote it."""


class WriteJobError(TxMQError):
    """A write job could not end as asked."""


class JobNotCommittedError(WriteJobError):
    """A commit that did not commit: another decision stands (the checker rolled the job back when its lease
    passed), or its stages were set aside. Nothing of the job was published; run it again."""


class UnpublishableJobError(WriteJobError):
    """A committed job whose rows cannot all be published: a stage is missing (expired, deleted, lost in a
    failover), holds an entry that cannot be published, or published fewer rows than its attempt staged. The job is
    parked (``txmq:jobs`` score ``+inf``, the reason in its record's ``parked`` field) and its stages kept for an
    operator; the checker does not retry it."""
