"""redis-txmq for asyncio services, mirroring the sync API the way ``redis.asyncio`` mirrors ``redis``:
``TransactionProducer`` (``async with``, ``await producer.send_message_in_transaction(...)``, ``async with
producer.transaction(message) as tx``) and an asyncio ``TransactionListener``; the messages, settings, results and
errors are the sync API's."""

from .listener import TransactionListener
from .producer import AsyncTransaction, TransactionProducer

__all__ = ["AsyncTransaction", "TransactionListener", "TransactionProducer"]
