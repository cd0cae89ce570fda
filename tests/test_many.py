"""Transactions of several messages: ``with producer.transaction() as tx: tx.send(...)`` and
``send_messages_in_transaction``. All messages become visible, each once, or none does; a producer that dies
between its decision and the end of every message leaves the rest to the checker, which follows the decision."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from redis_txmq import (
    InvalidMessageError,
    LocalTransactionState,
    Message,
    PrepareError,
    Settings,
    TransactionProducer,
    TxMQConnectionError,
    create_topic,
)
from redis_txmq.checker import Checker
from redis_txmq.cli import main
from redis_txmq.core.errors import ProducerGroupMismatchError, TransactionConflictError
from redis_txmq.core.keys import decision_key, topic_keys_of_stream
from redis_txmq.core.protocol import DeadAction, EndSource
from redis_txmq.ops.admin import resolve_dead_transaction

from .helpers import ScriptedListener, wait_until

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
FAST_CHECKS = Settings(transaction_timeout=0, check_interval=0.05)


class OrderRefused(Exception):
    pass


def bodies(client, stream: str) -> list[bytes]:
    return [fields[b"body"] for _, fields in client.xrange(stream)]


def in_flight(client, *streams: str) -> int:
    return sum(int(client.hlen(topic_keys_of_stream(stream).inflight)) for stream in streams)


STREAMS = ("orders", "audit#0", "audit#1")


@pytest.fixture
def partitioned_audit(client):
    create_topic(client, "audit", 2)


def test_the_messages_of_a_block_become_visible_together(client, partitioned_audit):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        with producer.transaction() as tx:
            first = tx.send(Message("orders", b"order 1", keys="order-1"))
            tx.send(Message("audit", b"audit a", keys="a"))
            tx.send(Message("audit", b"audit b", keys="b"))
            assert bodies(client, "orders") == [] and in_flight(client, *STREAMS) == 3, "invisible until the end"
            assert first.transaction_id == f"{tx.transaction_id}.0"
        results = tx.results
    assert [r.local_transaction_state for r in results] == [COMMIT] * 3 and all(r.committed_id for r in results)
    assert bodies(client, "orders") == [b"order 1"]
    assert sorted(bodies(client, "audit#0") + bodies(client, "audit#1")) == [b"audit a", b"audit b"]
    ids = {f[b"transaction_id"].decode() for s in STREAMS for _, f in client.xrange(s)}
    assert ids == {f"{tx.transaction_id}.{i}" for i in range(3)}, "each message has its own id, under the transaction's"
    assert in_flight(client, *STREAMS) == 0
    assert client.hget(decision_key(tx.transaction_id), "outcome") == b"COMMIT"
    assert client.pttl(decision_key(tx.transaction_id)) > 0, "the decision is not kept for ever"


def test_a_block_that_raises_drops_every_message(client, partitioned_audit):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        with pytest.raises(OrderRefused):
            with producer.transaction() as tx:
                tx.send(Message("orders", b"order 1"))
                tx.send(Message("audit", b"audit", keys="a"))
                raise OrderRefused("out of stock")
    assert [r.local_transaction_state for r in tx.results] == [ROLLBACK, ROLLBACK]
    assert all(bodies(client, s) == [] for s in STREAMS) and in_flight(client, *STREAMS) == 0


def test_a_message_that_cannot_be_written_rolls_back_those_written(client):
    client.set("audit", "not a stream")
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        with pytest.raises(PrepareError, match="another type"):
            with producer.transaction() as tx:
                tx.send(Message("orders", b"order 1"))
                tx.send(Message("audit", b"audit"))
    assert [r.local_transaction_state for r in tx.results] == [ROLLBACK]
    assert bodies(client, "orders") == [] and in_flight(client, "orders") == 0


def test_send_messages_in_transaction_runs_the_listener_once_with_the_transaction_id(client):
    listener = ScriptedListener()
    with TransactionProducer("order_group", listener, client=client) as producer:
        messages = [Message("orders", b"1"), Message("orders", b"2"), Message("invoices", b"3")]
        results = producer.send_messages_in_transaction(messages, COMMIT)
    (seen,) = listener.executed
    assert seen.body == b"1" and [r.transaction_id for r in results] == [f"{seen.transaction_id}.{i}" for i in range(3)]
    assert bodies(client, "orders") == [b"1", b"2"] and bodies(client, "invoices") == [b"3"]
    assert all(m.transaction_id is None for m in messages), "the caller's messages are not changed"


def test_a_transaction_has_a_bounded_number_of_messages(client):
    settings = Settings(max_transaction_messages=2)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings) as producer:
        with pytest.raises(InvalidMessageError, match="at most 2 messages"):
            producer.send_messages_in_transaction([Message("orders", b"x")] * 3, COMMIT)
    assert bodies(client, "orders") == [] and in_flight(client, "orders") == 0


def test_a_decision_without_its_ends_is_finished_by_the_checker_without_asking(client, partitioned_audit):
    """The producer decided COMMIT and died before ending any message: the checker ends them all with the
    decision; the listener's check-back is never asked (its answer could no longer change anything)."""
    listener = ScriptedListener(check_answer=ROLLBACK)
    with TransactionProducer("order_group", listener, client=client, settings=FAST_CHECKS) as producer:

        def died(ends):
            raise TxMQConnectionError("the producer died")

        producer.broker.end_transactions = died
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            tx.send(Message("audit", b"audit a", keys="a"))
            tx.send(Message("audit", b"audit b", keys="b"))
        assert client.hget(decision_key(tx.transaction_id), "outcome") == b"COMMIT"
        assert in_flight(client, *STREAMS) == 3 and bodies(client, "orders") == []
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() and in_flight(client, *STREAMS) == 0)
    assert bodies(client, "orders") == [b"order 1"]
    assert sorted(bodies(client, "audit#0") + bodies(client, "audit#1")) == [b"audit a", b"audit b"]
    assert listener.checked == []


def test_without_a_decision_every_message_follows_the_first_answer(client, partitioned_audit):
    """The producer died before deciding: the check-back asks about the transaction's id; the first answer is
    written as the decision and every message follows it, even if later answers would say otherwise."""
    answers = iter([COMMIT] + [ROLLBACK] * 100)
    listener = ScriptedListener(check_answer=lambda message: next(answers))
    with TransactionProducer("order_group", listener, client=client, settings=FAST_CHECKS) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.send(Message("audit", b"audit a", keys="a"))
            tx.send(Message("audit", b"audit b", keys="b"))
            tx.state.results = []  # the process is gone before its block ends: nothing decided, nothing ended
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, *STREAMS) == 0)
    assert {m.transaction_id for m in listener.checked} == {tx.transaction_id}, "asked about the transaction's id"
    assert bodies(client, "orders") == [b"order 1"]
    assert sorted(bodies(client, "audit#0") + bodies(client, "audit#1")) == [b"audit a", b"audit b"]
    assert client.hget(decision_key(tx.transaction_id), "outcome") == b"COMMIT"


def test_an_unknown_outcome_leaves_the_transaction_to_the_check_back(client):
    listener = ScriptedListener(check_answer=ROLLBACK)
    with TransactionProducer("order_group", listener, client=client, settings=FAST_CHECKS) as producer:
        results = producer.send_messages_in_transaction([Message("orders", b"1"), Message("orders", b"2")], UNKNOWN)
        assert [r.local_transaction_state for r in results] == [UNKNOWN, UNKNOWN]
        assert not client.exists(decision_key(results[0].transaction_id.split(".")[0]))
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert bodies(client, "orders") == []


def dead_letters(client, *streams: str) -> int:
    return sum(int(client.hlen(topic_keys_of_stream(stream).dead_index)) for stream in streams)


def test_an_operator_resolves_a_dead_lettered_message_for_its_whole_transaction(real_client, redis_url):
    """Nobody answered and the messages were dead-lettered. Committing one of them writes the transaction's decision
    and commits every dead-lettered message of it; one put back in flight meanwhile is ended with the decision by
    the checker, whatever its check-back would say; the other outcome is refused for any of them afterwards."""
    create_topic(real_client, "audit", 2)
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=2)
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        messages = [Message("orders", b"order 1"), Message("audit", b"audit a", keys="a")]
        results = producer.send_messages_in_transaction(messages + [Message("audit", b"audit b", keys="b")], UNKNOWN)
        ids = [result.transaction_id for result in results]
        checker = Checker(real_client, settings)
        wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, *STREAMS) == 3)
        parent = ids[0].rpartition(".")[0]
        broker = checker.broker
        keys = topic_keys_of_stream("orders")
        broker.resolve_dead(keys, ids[0], DeadAction.RECHECK)  # back in flight by hand, alone
        listener.check_answer = ROLLBACK

        cli = CliRunner().invoke(main, ["dead", "commit", ids[1], "--redis-url", redis_url])
        assert cli.exit_code == 0, cli.output
        assert f"transaction {parent} of several messages" in " ".join(cli.output.split())
        assert real_client.hget(decision_key(parent), "outcome") == b"COMMIT"
        assert dead_letters(real_client, *STREAMS) == 0, "every dead-lettered message of it was committed"
        assert sorted(bodies(real_client, "audit#0") + bodies(real_client, "audit#1")) == [b"audit a", b"audit b"]

        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, *STREAMS) == 0)
        assert bodies(real_client, "orders") == [b"order 1"], "the one in flight followed the decision"
        with pytest.raises(TransactionConflictError, match="decided COMMIT"):
            resolve_dead_transaction(broker, ids[2], DeadAction.ROLLBACK)
        again, resolved = resolve_dead_transaction(broker, ids[2], DeadAction.COMMIT)
        assert again == parent and [r.result.applied for r in resolved] == [False]


def test_asyncio_the_messages_of_a_block_become_visible_together(real_client, redis_url):
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    create_topic(real_client, "audit", 2)

    async def main():
        async with AsyncTransactionProducer("order_group", ScriptedListener(), redis_url=redis_url) as producer:
            async with producer.transaction() as tx:
                await tx.send(Message("orders", b"order 1"))
                await tx.send(Message("audit", b"audit a", keys="a"))
                assert bodies(real_client, "orders") == [], "invisible until the end"
            with pytest.raises(OrderRefused):
                async with producer.transaction() as dropped:
                    await dropped.send(Message("orders", b"order 2"))
                    raise OrderRefused("out of stock")
            listed = await producer.send_messages_in_transaction(
                [Message("orders", b"3"), Message("audit", b"4")], COMMIT
            )
            return tx, dropped, listed

    tx, dropped, listed = asyncio.run(main())
    assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]
    assert [r.local_transaction_state for r in dropped.results] == [ROLLBACK]
    assert [r.local_transaction_state for r in listed] == [COMMIT, COMMIT]
    assert bodies(real_client, "orders") == [b"order 1", b"3"]
    assert sorted(bodies(real_client, "audit#0") + bodies(real_client, "audit#1")) == [b"4", b"audit a"]
    assert in_flight(real_client, *STREAMS) == 0


def lose_the_reply_of(broker, body: bytes):
    """The prepare of the message ``body`` runs on Redis, then its reply is lost (a durability shortfall, a dropped
    connection): the send raises although its half message exists."""
    prepare = broker.prepare_half

    def prepare_half(keys, message, *args, **kwargs):
        result = prepare(keys, message, *args, **kwargs)
        if message.body == body:
            raise PrepareError(f"topic {keys.topic!r}: the reply was lost")
        return result

    broker.prepare_half = prepare_half


def test_a_send_that_raised_is_never_published_and_its_retry_is_published_once(client):
    """Defect: the checker ended every half message of the transaction with the decision, so a send that raised
    (its half message written) was published on COMMIT, and its retry a second time."""
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=FAST_CHECKS) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            with pytest.raises(PrepareError, match="rolled back whatever the transaction decides") as raised:
                tx.send(Message("orders", b"invoice"))
            assert "published once" in str(raised.value)
            producer.broker.prepare_half = type(producer.broker).prepare_half.__get__(producer.broker)
            tx.send(Message("orders", b"invoice"))  # the retry the error advises
        assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert sorted(bodies(client, "orders")) == [b"invoice", b"order 1"]
    ids = [f[b"transaction_id"].decode() for _, f in client.xrange("orders")]
    assert ids == [f"{tx.transaction_id}.0", f"{tx.transaction_id}.2"], "the failed send's index is not published"


def test_a_send_that_raised_stays_unpublished_when_the_check_back_decides(client):
    """The same, with the producer gone before its block ended: the check-back answers COMMIT for the transaction;
    the message whose send raised is rolled back, its retry published once."""
    listener = ScriptedListener(check_answer=COMMIT)
    with TransactionProducer("order_group", listener, client=client, settings=FAST_CHECKS) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            with pytest.raises(PrepareError):
                tx.send(Message("orders", b"invoice"))
            producer.broker.prepare_half = type(producer.broker).prepare_half.__get__(producer.broker)
            tx.send(Message("orders", b"invoice"))
            tx.state.results = []  # the process is gone before its block ends: nothing decided, nothing ended
        assert in_flight(client, "orders") == 2, "the failed send's half message was rolled back right away"
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert sorted(bodies(client, "orders")) == [b"invoice", b"order 1"]


def test_a_failed_send_that_could_not_be_marked_is_rolled_back_by_the_checker(client):
    """The send raised and Redis could not be reached to mark it: the next send refuses until it can, the decision
    carries the mark, and the checker rolls that half message back whatever the decision (COMMIT here)."""
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=FAST_CHECKS) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        decide = producer.broker.decide

        def unreachable(*args, **kwargs):
            raise TxMQConnectionError("Redis unreachable")

        producer.broker.decide = unreachable
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            with pytest.raises(PrepareError, match="could not be marked as failed yet"):
                tx.send(Message("orders", b"invoice"))
            with pytest.raises(PrepareError, match="cannot be marked as failed"):
                tx.send(Message("orders", b"other"))
            producer.broker.decide = decide
            producer.broker.end_transactions = unreachable  # the ends are lost: the checker ends both
        assert client.hget(decision_key(tx.transaction_id), "voided") == b" 1 "
        assert in_flight(client, "orders") == 2
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert bodies(client, "orders") == [b"order 1"]


def test_asyncio_a_send_cancelled_after_its_half_was_written_is_never_published(real_client, redis_url):
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    async def main():
        async with AsyncTransactionProducer(
            "order_group", ScriptedListener(), redis_url=redis_url, settings=FAST_CHECKS
        ) as producer:
            prepare = producer.broker.prepare_half

            async def prepare_half(keys, message, *args, **kwargs):
                result = await prepare(keys, message, *args, **kwargs)
                if message.body == b"invoice":
                    await asyncio.sleep(30)  # the reply is late: the caller's timeout cancels the send
                return result

            producer.broker.prepare_half = prepare_half
            async with producer.transaction() as tx:
                await tx.send(Message("orders", b"order 1"))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(tx.send(Message("orders", b"invoice")), 0.2)
            return tx

    tx = asyncio.run(main())
    assert [r.local_transaction_state for r in tx.results] == [COMMIT]
    checker = Checker(real_client, FAST_CHECKS)
    wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert bodies(real_client, "orders") == [b"order 1"]


def test_the_record_outlives_the_dead_letters_of_its_transaction(real_client, redis_url):
    """Defect: the decision expired after max_age + the dedupe window while a message of its transaction stayed
    dead-lettered, and `txmq dead rollback` then decided the other way of what was published."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=2)
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        late = Message("invoices", b"b", check_immunity_seconds=1.0)  # checked first once the other one is dead
        results = producer.send_messages_in_transaction([Message("orders", b"a"), late], UNKNOWN)
        ids = [result.transaction_id for result in results]
        parent = ids[0].rpartition(".")[0]
        checker = Checker(real_client, settings)
        wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, "orders") == 1)
        listener.check_answer = COMMIT
        wait_until(lambda: checker.run_round() is not None and bodies(real_client, "invoices") == [b"b"])
    assert real_client.hget(decision_key(parent), "outcome") == b"COMMIT"
    assert real_client.pttl(decision_key(parent)) == -1, "kept while a message of it is dead-lettered"
    if real_client.pttl(decision_key(parent)) > 0:
        real_client.delete(decision_key(parent))  # what its expiry would do
    cli = CliRunner().invoke(main, ["dead", "rollback", ids[0], "--redis-url", redis_url])
    assert cli.exit_code != 0 and "decided COMMIT" in " ".join(cli.output.split()), cli.output
    cli = CliRunner().invoke(main, ["dead", "commit", ids[0], "--redis-url", redis_url])
    assert cli.exit_code == 0, cli.output
    assert bodies(real_client, "orders") == [b"a"]
    assert real_client.pttl(decision_key(parent)) > 0, "no dead letter left: the record expires"


def test_a_message_of_a_decided_transaction_is_ended_with_the_decision_not_dead_lettered(client):
    """Defect: a message whose checks ran out before its producer's decision was dead-lettered without reading it."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.state.results = []  # the decision is late
        checker = Checker(client, settings)
        wait_until(lambda: checker.run_round().checks_sent == 1)  # the one check allowed, unanswered
        producer.broker.decide(tx.transaction_id, "order_group", COMMIT, EndSource.PRODUCER)  # its ends never came
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert bodies(client, "orders") == [b"order 1"] and dead_letters(client, "orders") == 0


def async_lose_the_reply_of(broker, body: bytes):
    """:func:`lose_the_reply_of` for the asyncio producer's broker; returns the original prepare."""
    prepare = broker.prepare_half

    async def prepare_half(keys, message, *args, **kwargs):
        result = await prepare(keys, message, *args, **kwargs)
        if message.body == body:
            raise PrepareError(f"topic {keys.topic!r}: the reply was lost")
        return result

    broker.prepare_half = prepare_half
    return prepare


async def async_settle(checker, client, *streams: str, timeout: float = 10.0):
    """Run check rounds until nothing is in flight; the asyncio producer answers checks in between."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while in_flight(client, *streams):
        assert loop.time() < deadline, "still in flight at the deadline"
        checker.run_round()
        await asyncio.sleep(0.05)


def test_asyncio_a_send_that_raised_is_rolled_back_at_once_and_its_retry_is_published_once(real_client, redis_url):
    """The asyncio twin of the sync test: the failed send is marked in the record and its half message rolled back
    by the producer itself (not left to the checker), and the error says so."""
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    async def main():
        async with AsyncTransactionProducer(
            "order_group", ScriptedListener(), redis_url=redis_url, settings=FAST_CHECKS
        ) as producer:
            prepare = async_lose_the_reply_of(producer.broker, b"invoice")
            async with producer.transaction() as tx:
                await tx.send(Message("orders", b"order 1"))
                with pytest.raises(PrepareError, match="rolled back whatever the transaction decides"):
                    await tx.send(Message("orders", b"invoice"))
                assert real_client.hget(decision_key(tx.transaction_id), "voided") == b" 1 "
                assert in_flight(real_client, "orders") == 1, "the failed send's half message is rolled back now"
                producer.broker.prepare_half = prepare
                await tx.send(Message("orders", b"invoice"))
            return tx

    tx = asyncio.run(main())
    assert [r.local_transaction_state for r in tx.results] == [COMMIT, COMMIT]
    assert in_flight(real_client, "orders") == 0
    ids = [f[b"transaction_id"].decode() for _, f in real_client.xrange("orders")]
    assert ids == [f"{tx.transaction_id}.0", f"{tx.transaction_id}.2"]
    assert sorted(bodies(real_client, "orders")) == [b"invoice", b"order 1"]


def test_asyncio_a_block_whose_every_send_raised_leaves_nothing_in_flight(real_client, redis_url):
    """Nothing to decide (no send returned): leaving the block marks the failed sends and rolls back their half
    messages at once."""
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    async def main():
        async with AsyncTransactionProducer(
            "order_group", ScriptedListener(), redis_url=redis_url, settings=FAST_CHECKS
        ) as producer:
            async_lose_the_reply_of(producer.broker, b"invoice")
            decide = producer.broker.decide
            refusals = iter([TxMQConnectionError("Redis unreachable")] * 2)

            async def decide_unreachable_twice(*args, **kwargs):
                for refusal in refusals:  # the send's own mark and the next send's fail: the block's end marks it
                    raise refusal
                return await decide(*args, **kwargs)

            producer.broker.decide = decide_unreachable_twice
            async with producer.transaction() as tx:
                with pytest.raises(PrepareError, match="could not be marked as failed yet"):
                    await tx.send(Message("orders", b"invoice"))
                with pytest.raises(PrepareError, match="cannot be marked as failed"):
                    await tx.send(Message("orders", b"other"))
                assert in_flight(real_client, "orders") == 1, "the refused send wrote nothing"
            return tx

    tx = asyncio.run(main())
    assert tx.results == []
    assert real_client.hget(decision_key(tx.transaction_id), "voided") == b" 0 "
    assert in_flight(real_client, "orders") == 0 and bodies(real_client, "orders") == []


def test_asyncio_a_decision_that_cannot_be_written_leaves_the_messages_to_the_check_back(real_client, redis_url):
    """The end of the block cannot reach Redis: each result says its end failed, every message stays in flight,
    and the check-back asks the producer group about the transaction's id (the one its messages carry)."""
    from redis_txmq.asyncio import TransactionProducer as AsyncTransactionProducer

    listener = ScriptedListener(check_answer=COMMIT)

    async def main():
        async with AsyncTransactionProducer(
            "order_group", listener, redis_url=redis_url, settings=FAST_CHECKS
        ) as producer:
            decide = producer.broker.decide

            async def unreachable(*args, **kwargs):
                raise TxMQConnectionError("Redis unreachable")

            producer.broker.decide = unreachable
            async with producer.transaction() as tx:
                await tx.send(Message("orders", b"order 1"))
                await tx.send(Message("orders", b"order 2"))
            assert all("Redis unreachable" in (r.end_error or "") for r in tx.results), tx.results
            assert in_flight(real_client, "orders") == 2
            producer.broker.decide = decide
            await async_settle(Checker(real_client, FAST_CHECKS), real_client, "orders")
            return tx

    tx = asyncio.run(main())
    assert {m.transaction_id for m in listener.checked} == {tx.transaction_id}, "asked about the transaction's id"
    assert sorted(bodies(real_client, "orders")) == [b"order 1", b"order 2"]


def test_a_recheck_puts_every_dead_lettered_message_of_the_transaction_back_in_flight(real_client):
    """`txmq dead recheck` of one message of a transaction of several re-checks all of them; the check-back's answer
    then decides the whole transaction."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("order_group", listener, client=real_client, settings=settings) as producer:
        results = producer.send_messages_in_transaction([Message("orders", b"1"), Message("orders", b"2")], UNKNOWN)
        checker = Checker(real_client, settings)
        wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, "orders") == 2)
        parent, resolved = resolve_dead_transaction(checker.broker, results[1].transaction_id, DeadAction.RECHECK)
        assert parent == results[0].transaction_id.rpartition(".")[0]
        assert sorted(r.transaction_id for r in resolved) == sorted(r.transaction_id for r in results)
        assert dead_letters(real_client, "orders") == 0 and in_flight(real_client, "orders") == 2
        listener.check_answer = COMMIT
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert sorted(bodies(real_client, "orders")) == [b"1", b"2"]


def test_a_decision_that_lands_as_its_message_is_dead_lettered_resolves_the_dead_letter(client):
    """The checker gives up on a message and pins its transaction's record; the producer's decision lands between
    the pin and the burial: the new dead letter is resolved with the decision at once, not left to an operator."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.state.results = []  # the decision is late
        checker = Checker(client, settings)
        wait_until(lambda: checker.run_round().checks_sent == 1)
        bury = checker.broker.bury_half

        def decided_meanwhile(*args, **kwargs):
            producer.broker.decide(tx.transaction_id, "order_group", COMMIT, EndSource.PRODUCER)
            return bury(*args, **kwargs)

        checker.broker.bury_half = decided_meanwhile
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert bodies(client, "orders") == [b"order 1"] and dead_letters(client, "orders") == 0
    assert client.pttl(decision_key(tx.transaction_id)) > 0, "no dead letter left: the record expires"


def test_the_record_of_a_transaction_refuses_another_producer_group(client):
    with TransactionProducer("order_group", ScriptedListener(), client=client) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.state.results = []
        producer.broker.decide(tx.transaction_id, "order_group", COMMIT, EndSource.PRODUCER)
        with pytest.raises(ProducerGroupMismatchError, match=tx.transaction_id) as raised:
            producer.broker.decide(tx.transaction_id, "billing_group", ROLLBACK, EndSource.CHECKER)
        assert raised.value.transaction_id == tx.transaction_id


def test_an_operator_commit_rolls_back_a_dead_lettered_message_whose_send_raised(client):
    """Both messages were dead-lettered before the block ended (slow local transaction); the second's send had
    raised, so the decision voids it: committing the transaction by hand publishes the first only."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
    with TransactionProducer("order_group", ScriptedListener(), client=client, settings=settings) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        decide = producer.broker.decide

        def unreachable(*args, **kwargs):
            raise TxMQConnectionError("Redis unreachable")

        checker = Checker(client, settings)
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            producer.broker.decide = unreachable
            with pytest.raises(PrepareError, match="could not be marked as failed yet"):
                tx.send(Message("orders", b"invoice"))
            wait_until(lambda: checker.run_round() is not None and dead_letters(client, "orders") == 2)
            producer.broker.decide = decide
        assert client.hget(decision_key(tx.transaction_id), "voided") == b" 1 "
        parent, resolved = resolve_dead_transaction(checker.broker, f"{tx.transaction_id}.0", DeadAction.COMMIT)
        assert parent == tx.transaction_id and len(resolved) == 2
    assert bodies(client, "orders") == [b"order 1"] and dead_letters(client, "orders") == 0


def test_a_failed_send_whose_rollback_was_lost_stays_unpublished_when_the_check_back_commits(client):
    """The failed send is marked in the record, but the producer's own rollback of its half message is lost and
    the process dies: the check-back answers COMMIT, and the checker rolls that half message back by the record."""
    listener = ScriptedListener(check_answer=COMMIT)
    with TransactionProducer("order_group", listener, client=client, settings=FAST_CHECKS) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        end_transactions = producer.broker.end_transactions

        def unreachable(*args, **kwargs):
            raise TxMQConnectionError("Redis unreachable")

        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            producer.broker.end_transactions = unreachable
            with pytest.raises(PrepareError, match="rolled back whatever the transaction decides"):
                tx.send(Message("orders", b"invoice"))
            producer.broker.end_transactions = end_transactions
            tx.state.results = []  # the process is gone before its block ends
        assert in_flight(client, "orders") == 2
        checker = Checker(client, FAST_CHECKS)
        wait_until(lambda: checker.run_round() is not None and in_flight(client, "orders") == 0)
    assert bodies(client, "orders") == [b"order 1"]
