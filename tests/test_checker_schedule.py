"""The checkers' schedule (``txmq:schedule``): rounds look at the topics with something due, not at every topic.

What a user relies on: an idle checker costs nothing per topic, and no check-back is missed for it — a prepare into
an idle topic wakes it, a prepare whose wake was lost (Cluster: the producer died between its prepare and its wake;
a producer of release 0.1.0, which never wakes) is found by a full pass, or by the rounds of every topic a checker
runs while such a producer is about. Against a real redis-server (the scripts and the schedule's compare).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer
from redis_txmq.checker import Checker
from redis_txmq.core.errors import TxMQConnectionError
from redis_txmq.core.keys import GROUP_REGISTRY, SCHEDULE, GroupKeys, TopicKeys
from redis_txmq.ops.admin import dead_letters, resolve_dead
from redis_txmq.sync.broker import DeadAction, RedisBroker

from .helpers import server_ms, wait_until

pytestmark = pytest.mark.real

GROUP = "schedule_group"
REQUESTS = GroupKeys(GROUP).check_requests
FAST = Settings(transaction_timeout=0.2, check_interval=0.3, heartbeat_interval=0.5, claim_idle=1.0, check_max=3)
_ids = itertools.count()


class Commits(TransactionListener):
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


@pytest.fixture
def producer(real_client: redis.Redis) -> Iterator[TransactionProducer]:
    producer = TransactionProducer(GROUP, Commits(), client=real_client, settings=FAST)
    producer.broker.load_scripts()  # no check-request reader: the tests read the requests themselves
    producer._state = "running"
    yield producer
    producer._state = "shut down"
    producer.broker.close()


def quiet_checker(client: redis.Redis, **options: Any) -> tuple[Checker, list[str]]:
    """A checker whose claims are recorded (the topic streams it looked at), its start-up full pass spent."""
    checker = Checker(client, FAST, full_pass_interval=1e9, sweep_interval=1e9, **options)
    looked: list[str] = []
    claim = checker.broker.claim_checks

    def recorded(keys: TopicKeys, limit: int) -> Any:
        looked.append(keys.topic_stream)
        return claim(keys, limit)

    checker.broker.claim_checks = recorded  # type: ignore[method-assign]
    checker.run_round()
    return checker, looked


def prepare(producer: TransactionProducer, topic: str) -> str:
    """A transaction prepared and left in flight (its producer "died" before its local transaction)."""
    transaction_id = f"tx-{next(_ids)}"
    producer.broker.prepare_half(TopicKeys(topic), Message(topic, b"body"), transaction_id, GROUP)
    return transaction_id


def requested(client: redis.Redis) -> set[str]:
    return {fields[b"transaction_id"].decode() for _, fields in client.xrange(REQUESTS)}


def round_after(client: redis.Redis, checker: Checker, seconds: float) -> None:
    until = server_ms(client) + seconds * 1000
    wait_until(lambda: server_ms(client) >= until, timeout=seconds + 5)
    checker.run_round()


def test_an_idle_checker_looks_at_no_topic_and_schedules_the_outcomes_to_forget(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    topics = [f"idle-{i}" for i in range(40)]
    for topic in topics:
        producer.send_message_in_transaction(Message(topic, b"paid"))
    checker, looked = quiet_checker(real_client)
    assert sorted(looked) == sorted(topics)  # the start-up full pass: the schedule did not cover the outcomes
    looked.clear()
    for _ in range(3):
        round_after(real_client, checker, 0.05)
    assert looked == []
    scheduled = dict(real_client.zrange(SCHEDULE, 0, -1, withscores=True))
    for topic in topics:
        ended_at = real_client.zrange(TopicKeys(topic).ended_at, 0, 0, withscores=True)[0][1]
        assert scheduled[topic.encode()] == ended_at + FAST.dedupe_window * 1000


def test_a_prepare_into_an_idle_topic_wakes_it_and_its_check_back_goes_out(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    checker, looked = quiet_checker(real_client)
    before = server_ms(real_client)
    transaction_id = prepare(producer, "woken")
    assert before <= real_client.zscore(SCHEDULE, "woken") <= server_ms(real_client)
    prepare(producer, "woken")  # nothing new to wake: the first one's time stands
    round_after(real_client, checker, 0.01)  # a look in the millisecond of a wake keeps it (it may not have seen it)
    assert looked == ["woken"]  # looked at once, nothing due yet: scheduled at the first one's due time
    assert real_client.zscore(SCHEDULE, "woken") >= before + FAST.transaction_timeout * 1000
    round_after(real_client, checker, FAST.transaction_timeout)
    assert transaction_id in requested(real_client)


def test_a_prepare_whose_wake_was_lost_waits_for_the_full_pass(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    """Cluster: the wake is the client's write to another slot; a producer that died before it leaves the topic
    unscheduled. The full pass finds it."""
    checker, looked = quiet_checker(real_client)
    producer.broker._wake_in_script = False
    producer.broker._wake = lambda *args: None  # type: ignore[method-assign]
    transaction_id = prepare(producer, "unwoken")
    assert real_client.zscore(SCHEDULE, "unwoken") is None
    round_after(real_client, checker, FAST.transaction_timeout)
    assert looked == [] and transaction_id not in requested(real_client)
    checker._next_full_pass = 0.0
    checker.run_round()
    assert looked == ["unwoken"] and transaction_id in requested(real_client)


def test_the_clients_wake_where_the_script_cannot_write_the_schedule(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    """What a producer on Cluster does: the prepare replies the time to wake the topic at, the client writes it."""
    checker, looked = quiet_checker(real_client)
    producer.broker._wake_in_script = False
    before = server_ms(real_client)
    transaction_id = prepare(producer, "client-woken")
    assert before <= real_client.zscore(SCHEDULE, "client-woken") <= server_ms(real_client)
    round_after(real_client, checker, FAST.transaction_timeout)
    assert transaction_id in requested(real_client)


def test_a_wake_during_a_round_is_not_overwritten_by_what_the_round_saw(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    """A round looks at a topic (nothing in flight), a prepare wakes it, then the round writes what it saw: the
    wake stands (the schedule keeps a score newer than the look)."""
    producer.send_message_in_transaction(Message("racy", b"paid"))
    checker, looked = quiet_checker(real_client)
    write = checker.broker.schedule_topics
    woken: list[str] = []

    def prepare_first(looks: Any) -> None:
        woken.append(prepare(producer, "racy"))
        write(looks)

    checker._next_full_pass = 0.0
    real_client.zadd(SCHEDULE, {"racy": 0})  # due now: the round looks at it
    checker.broker.schedule_topics = prepare_first  # type: ignore[method-assign]
    checker.run_round()
    checker.broker.schedule_topics = write  # type: ignore[method-assign]
    assert looked[-1] == "racy" and woken
    assert real_client.zscore(SCHEDULE, "racy") <= server_ms(real_client)  # due: the next round looks
    round_after(real_client, checker, FAST.transaction_timeout)
    assert woken[0] in requested(real_client)


def test_while_a_producer_of_release_0_1_0_is_about_every_round_looks_at_every_topic(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    topics = ["legacy-a", "legacy-b", "legacy-c"]
    for topic in topics:
        producer.send_message_in_transaction(Message(topic, b"paid"))
    real_client.sadd(GROUP_REGISTRY, GROUP)
    real_client.zadd(GroupKeys(GROUP).producers, {"producer-of-0.1.0": server_ms(real_client)})  # no layout record
    checker, looked = quiet_checker(real_client)
    assert checker._legacy == [(GROUP, "producer-of-0.1.0")]
    looked.clear()
    checker.run_round()
    assert sorted(looked) == topics
    real_client.zrem(GroupKeys(GROUP).producers, "producer-of-0.1.0")
    checker._next_legacy_check = 0.0
    looked.clear()
    checker.run_round()
    assert checker._legacy == [] and looked == []


def test_a_schedule_member_that_is_no_topic_stream_key_is_dropped(real_client: redis.Redis) -> None:
    checker, _ = quiet_checker(real_client)
    real_client.zadd(SCHEDULE, {"orders#not-a-number": 0})
    checker.run_round()
    assert real_client.zscore(SCHEDULE, "orders#not-a-number") is None


def test_a_schedule_that_cannot_be_written_leaves_the_topics_due(
    real_client: redis.Redis, producer: TransactionProducer
) -> None:
    checker, looked = quiet_checker(real_client)
    first = prepare(producer, "unwritten")
    write = checker.broker.schedule_topics

    def dropped(looks: Any) -> None:
        raise TxMQConnectionError("connection reset")

    checker.broker.schedule_topics = dropped  # type: ignore[method-assign]
    round_after(real_client, checker, FAST.transaction_timeout)
    assert first in requested(real_client)
    assert real_client.zscore(SCHEDULE, "unwritten") <= server_ms(real_client)  # still due
    checker.broker.schedule_topics = write  # type: ignore[method-assign]
    looked.clear()
    checker.run_round()
    assert looked == ["unwritten"]
    assert real_client.zscore(SCHEDULE, "unwritten") > server_ms(real_client)  # its next check's time


@pytest.mark.parametrize("in_script", [True, False], ids=["one-server", "client-wake"])
def test_an_operators_recheck_wakes_the_topic(
    real_client: redis.Redis, producer: TransactionProducer, in_script: bool
) -> None:
    """``txmq dead recheck`` puts a dead-lettered transaction back in flight, due now: its topic is woken."""
    checker, _ = quiet_checker(real_client)
    transaction_id = f"tx-{next(_ids)}"
    keys = TopicKeys("rechecked")
    prepared = producer.broker.prepare_half(keys, Message("rechecked", b"body"), transaction_id, GROUP)
    checker.broker.bury_half(keys, transaction_id, prepared.half_id, "given up", GROUP)
    assert [letter["transaction_id"] for letter in dead_letters(real_client)] == [transaction_id]
    real_client.zrem(SCHEDULE, "rechecked")
    real_client.delete(REQUESTS)
    operator = RedisBroker(real_client, FAST)
    operator._wake_in_script = in_script
    before = server_ms(real_client)
    resolve_dead(operator, transaction_id, DeadAction.RECHECK, topic="rechecked")
    assert before <= real_client.zscore(SCHEDULE, "rechecked") <= server_ms(real_client) + 1
    checker.run_round()
    assert transaction_id in requested(real_client)


def test_topics_whose_looks_keep_failing_do_not_hide_the_others(
    real_client: redis.Redis, producer: TransactionProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More failing topics due than one round reads (damaged keys here; on Cluster, a master down): each is held a
    few seconds on in the schedule after its failed look, so a healthy topic due later still gets its check."""
    monkeypatch.setattr("redis_txmq.checker.worker.DUE_TOPICS_PER_ROUND", 3)
    checker, looked = quiet_checker(real_client)
    for i in range(4):
        prepare(producer, f"damaged-{i}")
        real_client.delete(TopicKeys(f"damaged-{i}").due)
        real_client.set(TopicKeys(f"damaged-{i}").due, "not a sorted set")  # another tool wrote over it
    healthy = prepare(producer, "healthy")
    round_after(real_client, checker, FAST.transaction_timeout)
    wait_until(lambda: (checker.run_round(), healthy in requested(real_client))[1], timeout=10)


def test_a_checker_of_a_few_topics_is_not_hidden_by_other_services_due_topics(
    real_client: redis.Redis, producer: TransactionProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's and the benchmarks' checkers look after their own topics only, every round: others' due
    topics (whose checker is down) must not fill their read of the schedule."""
    monkeypatch.setattr("redis_txmq.checker.worker.DUE_TOPICS_PER_ROUND", 3)
    for i in range(5):
        prepare(producer, f"others-{i}")
    mine = prepare(producer, "mine")
    checker = Checker(real_client, FAST, only_topics={"mine"})
    round_after(real_client, checker, FAST.transaction_timeout)
    assert mine in requested(real_client)
    assert not requested(real_client) - {mine}
