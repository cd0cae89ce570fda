"""The record of a transaction of several messages at its edges: a decision made while the block is still open (by
a check-back or an operator), a message dead-lettered before its transaction was decided, faults between the
checker's steps on the record, and a record whose master cannot be reached. Each is a case an adversarial review
reproduced on a real redis-server: none may publish a message twice, leave a decided transaction half published,
keep a record for ever, or hold back the checks of other transactions."""

from __future__ import annotations

import pytest
import redis

from redis_txmq import LocalTransactionState, Message, PrepareError, Settings, TransactionProducer, TxMQConnectionError
from redis_txmq.checker import Checker
from redis_txmq.core.keys import decision_key, topic_keys_of_stream
from redis_txmq.core.protocol import DeadAction, EndSource, RecordAction
from redis_txmq.ops.admin import resolve_dead_transaction

from .helpers import ScriptedListener, wait_until
from .test_many import bodies, dead_letters, in_flight, lose_the_reply_of

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
FAST = Settings(transaction_timeout=0, check_interval=0.05)
ONE_CHECK = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)


def interrupted_before_release(broker, transaction_id: str) -> None:
    """`txmq dead commit transaction_id` whose process dies after resolving, before it releases the record."""
    decide = broker.decide

    def crash_on_release(parent, group, action, source, indices=(), **kwargs):
        if action is RecordAction.UNPIN:
            raise TxMQConnectionError("the operator's process died")
        return decide(parent, group, action, source, indices, **kwargs)

    broker.decide = crash_on_release
    try:
        with pytest.raises(TxMQConnectionError):
            resolve_dead_transaction(broker, transaction_id, DeadAction.COMMIT)
    finally:
        broker.decide = decide


def unreachable(*args, **kwargs):
    raise TxMQConnectionError("Redis unreachable")


def test_a_send_that_failed_after_an_early_commit_follows_that_commit(real_client):
    """A COMMIT decided while the block is open (an operator, a check-back): a later send whose reply was lost is
    not voided (too late) and is published with the transaction, as its error says — not rolled back by the
    producer and lost."""
    with TransactionProducer("g", ScriptedListener(), client=real_client, settings=FAST) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            producer.broker.decide(tx.transaction_id, "g", COMMIT, EndSource.CHECKER)
            with pytest.raises(PrepareError, match="published with the transaction"):
                tx.send(Message("orders", b"invoice"))
        checker = Checker(real_client, FAST)
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert sorted(bodies(real_client, "orders")) == [b"invoice", b"order 1"]


def test_after_an_early_commit_a_failed_send_that_could_not_be_marked_is_not_sent_again(real_client):
    """The same with the mark unwritable: the checker may publish the failed send with the COMMIT, so the next send
    is refused (naming the decision) instead of publishing the body a second time."""
    with TransactionProducer("g", ScriptedListener(), client=real_client, settings=FAST) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        decide = producer.broker.decide
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            decide(tx.transaction_id, "g", COMMIT, EndSource.CHECKER)
            producer.broker.decide = unreachable
            with pytest.raises(PrepareError, match="unless the transaction was decided meanwhile"):
                tx.send(Message("orders", b"invoice"))
            producer.broker.decide = decide
            checker = Checker(real_client, FAST)
            checker.run_round()
            producer.broker.prepare_half = type(producer.broker).prepare_half.__get__(producer.broker)
            with pytest.raises(
                PrepareError, match=r"already decided COMMIT .* \[1\] follow it: do not send them again"
            ):
                tx.send(Message("orders", b"invoice"))
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert sorted(bodies(real_client, "orders")) == [b"invoice", b"order 1"], "once"


def test_a_message_dead_lettered_before_its_transaction_was_decided_follows_the_decision(real_client):
    """A slow block: its first message's checks ran out (UNKNOWN while the block is open) and it was dead-lettered;
    the block then sent another message and committed. The checker's sweep resolves the dead letter with the
    decision: the transaction is not left half published until an operator looks, and its record is released."""
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("g", listener, client=real_client, settings=ONE_CHECK) as producer:
        checker = Checker(real_client, ONE_CHECK, sweep_interval=0)
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, "orders") == 1)
            tx.send(Message("invoices", b"invoice"))
        assert bodies(real_client, "invoices") == [b"invoice"]
        wait_until(lambda: checker.run_round() is not None and bodies(real_client, "orders") == [b"order 1"])
    assert dead_letters(real_client, "orders") == 0
    assert real_client.pttl(decision_key(tx.transaction_id)) > 0, "nothing dead-lettered: the record expires"


@pytest.mark.parametrize("decided", ["by its block", "by its producer after a failed burial"])
def test_a_burial_that_failed_leaves_no_record_kept_for_ever(real_client, decided):
    """The checker pinned the record and the burial failed (a dropped connection); the transaction was then
    decided: its message is published and nothing pins the record any more."""
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("g", listener, client=real_client, settings=ONE_CHECK) as producer:
        checker = Checker(real_client, ONE_CHECK)
        bury, tried = checker.broker.bury_half, []

        def failing_bury(*args, **kwargs):
            tried.append(args)
            raise TxMQConnectionError("connection reset")

        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            checker.broker.bury_half = failing_bury
            wait_until(lambda: checker.run_round() is not None and tried)
            checker.broker.bury_half = bury
            if decided != "by its block":
                producer.broker.decide(tx.transaction_id, "g", COMMIT, EndSource.PRODUCER)
                tx.state.results = []  # its ends never came
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert bodies(real_client, "orders") == [b"order 1"] and dead_letters(real_client, "orders") == 0
    assert real_client.pttl(decision_key(tx.transaction_id)) > 0, "nothing dead-lettered: the record expires"


def test_an_operator_who_runs_again_after_a_crash_releases_the_record(real_client):
    """`txmq dead commit` resolved the dead letter and died before releasing the record: run again, it finds the
    group in the record and releases it."""
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("g", listener, client=real_client, settings=ONE_CHECK) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.state.results = []  # the process died
        checker = Checker(real_client, ONE_CHECK)
        wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, "orders") == 1)
    txid, broker = f"{tx.transaction_id}.0", checker.broker
    interrupted_before_release(broker, txid)
    resolve_dead_transaction(broker, txid, DeadAction.COMMIT)
    assert bodies(real_client, "orders") == [b"order 1"]
    assert real_client.pttl(decision_key(tx.transaction_id)) > 0, "nothing dead-lettered: the record expires"


def test_a_record_that_cannot_be_read_holds_back_only_its_own_messages(real_client):
    """The record of one transaction of several messages cannot be read (on a cluster: its slot's master is down):
    a transaction of one message claimed with it in the same topic is still asked and committed, not
    dead-lettered; the message whose record is unreadable waits without spending its checks."""
    settings = Settings(transaction_timeout=0, check_interval=0.05, check_max=3)
    listener = ScriptedListener(check_answer=COMMIT)
    with TransactionProducer("g", listener, client=real_client, settings=settings) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"of several"))
            tx.state.results = []  # left in flight
        single = producer.send_message_in_transaction(Message("orders", b"single"), UNKNOWN)
        checker = Checker(real_client, settings)
        decisions = checker.broker.decisions

        def master_down(ids):
            raise redis.ConnectionError(f"{decision_key(tx.transaction_id)}: the master of its slot is down")

        checker.broker.decisions = master_down
        wait_until(lambda: checker.run_round() is not None and bodies(real_client, "orders") == [b"single"])
        for _ in range(5):
            checker.run_round()
        keys = topic_keys_of_stream("orders")
        assert dead_letters(real_client, "orders") == 0
        assert int(real_client.hget(keys.checks, f"{tx.transaction_id}.0") or 0) <= 1, "its checks were given back"
        checker.broker.decisions = decisions
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert sorted(bodies(real_client, "orders")) == [b"of several", b"single"]
    assert single.transaction_id in {f[b"transaction_id"].decode() for _, f in real_client.xrange("orders")}


def test_a_send_that_failed_after_an_early_commit_is_not_sent_again(real_client):
    """Found by the model: its error says the failed send is published with the transaction; a retry anyway is
    refused, so the body is published once."""
    with TransactionProducer("g", ScriptedListener(), client=real_client, settings=FAST) as producer:
        lose_the_reply_of(producer.broker, b"invoice")
        with producer.transaction() as tx:
            tx.send(Message("orders", b"order 1"))
            producer.broker.decide(tx.transaction_id, "g", COMMIT, EndSource.CHECKER)
            with pytest.raises(PrepareError, match="published with the transaction"):
                tx.send(Message("orders", b"invoice"))
            producer.broker.prepare_half = type(producer.broker).prepare_half.__get__(producer.broker)
            with pytest.raises(PrepareError, match="already decided COMMIT"):
                tx.send(Message("orders", b"invoice"))
        checker = Checker(real_client, FAST)
        wait_until(lambda: checker.run_round() is not None and in_flight(real_client, "orders") == 0)
    assert sorted(bodies(real_client, "orders")) == [b"invoice", b"order 1"]


def test_an_operator_who_runs_again_releases_every_message_the_interrupted_run_resolved(real_client):
    """Found by the model: the interrupted run resolved two dead letters of the transaction and died before
    releasing the record; run again for one of them, it releases both."""
    listener = ScriptedListener(check_answer=UNKNOWN)
    with TransactionProducer("g", listener, client=real_client, settings=ONE_CHECK) as producer:
        tx = producer.transaction()
        with tx:
            tx.send(Message("orders", b"order 1"))
            tx.send(Message("invoices", b"invoice"))
            tx.state.results = []  # the process died
        checker = Checker(real_client, ONE_CHECK)
        wait_until(lambda: checker.run_round() is not None and dead_letters(real_client, "orders", "invoices") == 2)
    broker = checker.broker
    interrupted_before_release(broker, f"{tx.transaction_id}.0")
    resolve_dead_transaction(broker, f"{tx.transaction_id}.0", DeadAction.COMMIT)
    assert bodies(real_client, "orders") == [b"order 1"] and bodies(real_client, "invoices") == [b"invoice"]
    assert real_client.pttl(decision_key(tx.transaction_id)) > 0, "nothing dead-lettered: the record expires"
