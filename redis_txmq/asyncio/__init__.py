"""redis-txmq for asyncio services, mirroring the sync API the way ``redis.asyncio`` mirrors ``redis``:
``TransactionProducer`` (``async with``, ``await producer.send_message_in_transaction(...)``, ``async with
producer.transaction(message) as tx``), an asyncio ``TransactionListener`` and ``Consumer`` (``async with``,
``async for``, ``await consumer.ack(message)``); the messages, settings, results and errors are the sync API's."""

from .consumer import Consumer
from .listener import TransactionListener
from .producer import AsyncTransaction, TransactionProducer

__all__ = ["AsyncTransaction", "Consumer", "TransactionListener", "TransactionProducer"]
