"""A producer process that dies between the decision of a transaction of several messages and the end of all of
them: ``python -m tests.many_worker REDIS_URL ENDS_BEFORE_KILL``.

It sends six messages over a topic and both partitions of another in one transaction, prints the transaction's id,
commits, and SIGKILLs itself once the decision is written and ``ENDS_BEFORE_KILL`` of the six end calls went out
(0: right after the decision)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer, create_topic
from redis_txmq.transport.connection import connect

SETTINGS = Settings(transaction_timeout=0.5, check_interval=0.2)
MESSAGES = [Message("orders", b"order %d" % i, keys=f"order-{i}") for i in range(2)] + [
    Message("audit", b"audit %d" % i, keys=f"key-{i}") for i in range(4)
]


def main() -> None:
    redis_url, ends_before_kill = sys.argv[1], int(sys.argv[2])
    client = connect(redis_url)
    create_topic(client, "audit", 2)
    with TransactionProducer("many_group", checker=lambda message: None, client=client, settings=SETTINGS) as producer:
        real_end_transactions = producer.broker.end_transactions

        def die_part_way(ends: list[Any]) -> Any:
            if ends_before_kill:
                real_end_transactions(ends[:ends_before_kill])
            os.kill(os.getpid(), signal.SIGKILL)

        producer.broker.end_transactions = die_part_way  # type: ignore[method-assign]
        with producer.transaction() as tx:
            for message in MESSAGES:
                tx.send(message)
            print(tx.transaction_id, flush=True)
            tx.end(LocalTransactionState.COMMIT, None)


if __name__ == "__main__":
    main()
