"""Item 5: Redis memory per transaction outside the topic stream (``MEMORY USAGE`` of every companion key).

* per in-flight transaction: N transactions prepared and not ended;
* per finished transaction within the dedupe window: N committed, their outcome and op record remembered;
* per finished transaction after the window: the same N once the window has passed and the checker's rounds
  (each forgets at most 1000 outcomes per topic) have run (the target is 0). The window is the settings'
  ``dedupe_window`` (at least 60 s), so this part waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis_txmq import LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.core.keys import TopicKeys

from .common import BODY, TOPIC_PREFIX, Answer, TopicChecker, delete_topic

IN_FLIGHT_TOPIC = f"{TOPIC_PREFIX}memory-inflight"
FINISHED_TOPIC = f"{TOPIC_PREFIX}memory-finished"


def companion_bytes(client: Any, topic: str) -> int:
    """Bytes Redis reports for every key of the topic except the topic stream itself."""
    keys = TopicKeys(topic)
    total = 0
    for key in keys.script_keys():
        if key != keys.topic_stream:
            total += client.memory_usage(key, samples=0) or 0
    return total


class MemoryProbe:
    """Fills two topics at :meth:`start`; :meth:`finish` measures after the window (waiting if needed)."""

    def __init__(self, client: Any, count: int, dedupe_window: float = 60.0) -> None:
        self.client = client
        self.count = count
        self.settings = Settings(dedupe_window=dedupe_window, transaction_timeout=3600)
        self.result: dict[str, Any] = {"transactions": count, "dedupe_window_s": dedupe_window}
        self._window_ends_at = 0.0

    def start(self) -> None:
        client, count = self.client, self.count
        for topic in (IN_FLIGHT_TOPIC, FINISHED_TOPIC):
            delete_topic(client, topic)
        with TransactionProducer(f"{TOPIC_PREFIX}memory", Answer(None), client=client, settings=self.settings) as p:
            for i in range(count):
                p.send_message_in_transaction(Message(IN_FLIGHT_TOPIC, BODY, keys=f"order-{i}"))
        self.result["in_flight_bytes_per_tx"] = companion_bytes(client, IN_FLIGHT_TOPIC) / count
        commit = Answer(LocalTransactionState.COMMIT)
        with TransactionProducer(f"{TOPIC_PREFIX}memory", commit, client=client, settings=self.settings) as p:
            for i in range(count):
                p.send_message_in_transaction(Message(FINISHED_TOPIC, BODY, keys=f"order-{i}"))
        self._window_ends_at = time.monotonic() + self.settings.dedupe_window + 1
        self.result["finished_bytes_per_tx_in_window"] = companion_bytes(client, FINISHED_TOPIC) / count
        delete_topic(client, IN_FLIGHT_TOPIC)

    def finish(self, wait: bool, tick: Callable[[float], None] = lambda seconds: None) -> dict[str, Any]:
        """After the window: one checker round forgets what is older, then the companions are measured again."""
        if wait:
            while (left := self._window_ends_at - time.monotonic()) > 0:
                time.sleep(min(left, 1.0))
                tick(min(left, 1.0))
            # a round forgets at most 1000 outcomes per topic (bounded work): run rounds until one forgets nothing
            checker = TopicChecker(self.client, self.settings, [FINISHED_TOPIC])
            rounds, left = 0, companion_bytes(self.client, FINISHED_TOPIC)
            while True:
                checker.run_round()
                rounds += 1
                before, left = left, companion_bytes(self.client, FINISHED_TOPIC)
                if left == 0 or left >= before:
                    break
            checker.heartbeat.leave()
            self.result["finished_bytes_per_tx_after_window"] = left / self.count
            self.result["checker_rounds_after_window"] = rounds
        else:
            self.result["finished_bytes_per_tx_after_window"] = None
        delete_topic(self.client, FINISHED_TOPIC)
        return self.result
