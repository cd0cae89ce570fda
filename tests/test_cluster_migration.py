"""A slot migrated while transactions run: MOVED/ASK are followed, a refused script call leaves nothing behind,
and with the check-back every committed transaction appears exactly once."""

from __future__ import annotations

import collections
import threading

import redis
from redis.cluster import RedisCluster

from redis_txmq import (
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionListener,
    TransactionProducer,
)
from redis_txmq.checker import Checker
from redis_txmq.core.keys import TopicKeys

from .helpers import wait_until

COMMIT = LocalTransactionState.COMMIT
TOPIC = "migrating-orders"


class Knows(TransactionListener):
    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.lock = threading.Lock()

    def execute_local_transaction(self, message, arg):
        with self.lock:
            self.committed.add(message.transaction_id)
        return COMMIT

    def check_local_transaction(self, message):
        with self.lock:
            return COMMIT if message.transaction_id in self.committed else LocalTransactionState.ROLLBACK


def node_client(node) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port)


def migrate_slot(cluster: RedisCluster, slot: int) -> None:
    """Move ``slot`` to another master key by key, the way redis-cli --cluster reshard does."""
    source = cluster.nodes_manager.get_node_from_slot(slot)
    target = next(n for n in cluster.get_primaries() if n.name != source.name)
    src, dst = node_client(source), node_client(target)
    src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 2):
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
    for node in cluster.get_primaries():
        node_client(node).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    src.close()
    dst.close()


def test_transactions_survive_a_slot_migration(cluster_url):
    cluster = RedisCluster.from_url(cluster_url)
    cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
    settings = Settings(transaction_timeout=0.5, check_interval=0.5, heartbeat_interval=0.5, cluster=True)
    listener = Knows()
    refused = []
    stop = threading.Event()
    checker = Checker(cluster, settings, scan_interval=0.1)
    checker_thread = threading.Thread(target=checker.run, args=(stop,))
    with TransactionProducer("migration_group", listener, client=cluster, settings=settings) as producer:

        def send_many() -> None:
            for i in range(600):
                try:
                    producer.send_message_in_transaction(Message(TOPIC, str(i).encode()))
                except PrepareError:
                    refused.append(i)  # refused before the local transaction: nothing to deliver

        sender = threading.Thread(target=send_many)
        sender.start()
        checker_thread.start()
        wait_until(lambda: cluster.xlen(TOPIC) >= 50, timeout=30)
        owner_before = cluster.get_node_from_key(TOPIC).name
        migrate_slot(cluster, cluster.keyslot(TOPIC))
        assert sender.is_alive(), "the migration must happen while transactions run"
        sent_during = cluster.xlen(TOPIC)
        sender.join(120)
        assert cluster.xlen(TOPIC) > sent_during and cluster.get_node_from_key(TOPIC).name != owner_before
        wait_until(
            lambda: cluster.hlen(TopicKeys(TOPIC).inflight) == 0 and cluster.xlen(TOPIC) == len(listener.committed),
            timeout=60,
        )
        stop.set()
        checker_thread.join(15)
    seen = collections.Counter(fields[b"transaction_id"].decode() for _, fields in cluster.xrange(TOPIC))
    assert set(seen.values()) == {1}, "no transaction appears twice"
    assert set(seen) == listener.committed
    assert len(seen) + len(refused) == 600
    cluster.close()
