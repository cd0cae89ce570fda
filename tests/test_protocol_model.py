"""The transaction protocol against a model: hypothesis' stateful testing drives the real producer, scripts and
checker on a real redis-server through random interleavings of sends (of one message and of several), lost
replies, sends that raise and are retried, local transactions that commit, roll back or are fenced, producers that
die at any step, check rounds and their answers, dead letters an operator resolves, and records that expire. A
plain Python model says what may be visible; after every step:

- no message is visible twice (by body and by transaction id);
- a visible message's send returned, and its transaction committed locally or an operator committed it;
- of a transaction of several messages, only messages whose send returned are visible;

and at quiescence (every open block ended or abandoned, the checker and an operator run until nothing is in flight):
every transaction all or nothing, committed exactly when its local transaction committed (unless an operator
decided otherwise), and nothing left in flight, requested or pinned (no memory past the windows).

The narrow fault paths also come as single rules, so that a search of CI's size meets them often: a send that can
neither be marked nor rolled back and then the block's end (``a_failed_send_then_the_block_ends``), a decision while
the block is open and then a send that fails (``send_after_an_early_decision``); every example starts with a
transaction of several messages open. The known defect shapes are pinned programs (``PINNED``,
``tests/model_programs.py``), run before the search in every run.

A failing example is shrunk and printed as a sequence of steps: make it a plain regression test. The run is seeded
at every setting (the same 200 examples each time; ``TXMQ_MODEL_EXAMPLES=N`` runs N, seeded too);
``TXMQ_MODEL_RANDOM=1`` explores new ones. ``tests/README.md`` says which defects it finds, and how fast
(``tests/model_defects/run.py`` re-introduces them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from redis_txmq import LocalTransactionState, Message, Settings, TransactionListener, TransactionProducer, create_topic
from redis_txmq.checker import Checker
from redis_txmq.core.errors import PrepareError, TransactionConflictError, TransactionError, TxMQConnectionError
from redis_txmq.core.keys import PRODUCERS_CONSUMER_GROUP, SCHEDULE, GroupKeys, decision_key, topic_keys_of_stream
from redis_txmq.core.log_rows import RowState, watch_row
from redis_txmq.core.protocol import DeadAction, EndSource, RecordAction
from redis_txmq.core.states import State, reachable
from redis_txmq.ops.admin import dead_letters, resolve_dead_transaction

from .model_programs import Programs, Steps

pytestmark = pytest.mark.real

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
GROUP = "model_group"
STREAMS = ("orders", "audit#0", "audit#1")
TOPICS = ("orders", "audit")
SETTINGS = Settings(transaction_timeout=0, check_interval=0.001, check_max=2, heartbeat_interval=0.2)
"""Every transaction in flight is due at every check round; two checks read and not answered dead-letter it."""
EXAMPLES = int(os.environ.get("TXMQ_MODEL_EXAMPLES", "200"))
RANDOM = bool(os.environ.get("TXMQ_MODEL_RANDOM"))
"""Seeded at every number of examples (the same examples on every run); ``TXMQ_MODEL_RANDOM=1`` explores new ones."""
PHASES = [p for p in Phase if os.environ.get("TXMQ_MODEL_SHRINK") != "0" or p not in (Phase.shrink, Phase.explain)]
"""``TXMQ_MODEL_SHRINK=0``: a failure is reported as found, not shrunk (to time the search alone)."""

CLIENT: redis.Redis | None = None
"""The real server of the test session (set by the test before the machine runs)."""


class Refused(Exception):
    """What a model local transaction raises to roll back."""


class ModelListener(TransactionListener):
    """Answers check-backs from the model's database, like the SQLAlchemy transaction log: COMMIT for a committed
    local transaction, UNKNOWN while its block is open or the database cannot be reached, else a fence (the local
    transaction can no longer commit) and ROLLBACK."""

    def __init__(self, model: ProtocolModel) -> None:
        self.model = model

    def execute_local_transaction(self, message: Message, arg: Any) -> Any:
        return UNKNOWN

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        transaction_id = message.transaction_id or ""
        if transaction_id in self.model.running or self.model.database_down:
            return UNKNOWN
        if self.model.local.get(transaction_id) == "COMMIT":
            return COMMIT
        self.model.local[transaction_id] = "FENCED"
        return ROLLBACK


class OpenSingle:
    def __init__(self, handle: Any, body: bytes) -> None:
        self.handle, self.body = handle, body
        self.transaction_id = handle.transaction_id


class OpenMany:
    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.transaction_id = handle.transaction_id


class OuterTransaction:
    """The database transaction around a block whose log row it holds (Django's ``ATOMIC_REQUESTS``, a session
    still open): the row's watch, as the Django and SQLAlchemy logs attach one (``redis_txmq.core.log_rows``)."""

    def __init__(self) -> None:
        self.row = RowState.PENDING
        self.then: list[Any] = []

    def state(self) -> RowState:
        return self.row

    def when_committed(self, then: Any) -> bool:
        self.then.append(then)
        return True

    def commits(self) -> None:
        self.row = RowState.COMMITTED
        for call in self.then:
            call()

    def rolls_back(self) -> None:
        self.row = RowState.ROLLED_BACK


class ProtocolModel(RuleBasedStateMachine):
    singles = Bundle("singles")
    manys = Bundle("manys")

    def __init__(self) -> None:
        super().__init__()
        assert CLIENT is not None
        self.client = CLIENT
        self.client.flushall()
        create_topic(self.client, "audit", 2)
        self.producer = TransactionProducer(GROUP, ModelListener(self), client=self.client, settings=SETTINGS)
        # started without its check-request reader: the model answers checks itself (rule answer_checks), so that
        # every interleaving is chosen by hypothesis, not by a thread's timing
        self.producer.broker.load_scripts()
        self.producer._state = "running"
        self.handler = self.producer._check_handler
        self.handler._set_up()
        # rounds follow the checkers' schedule alone: the one full pass (over an empty server) is spent at once, and
        # another comes only when a rule asks for it (full_pass)
        self.checker = Checker(self.client, SETTINGS, full_pass_interval=1e9, sweep_interval=1e9)
        self.checker.start()
        self.checker.scan()
        self.unwoken: set[str] = set()
        """Topic streams a prepare did not wake (its producer died before its wake, on Cluster): until a full
        pass, the schedule need not cover them."""
        self.last_round_ms = 0
        self.bodies = 0
        self.local: dict[str, str] = {}
        """Transaction id -> COMMIT (its local transaction committed) or FENCED (a check-back fenced it)."""
        self.running: set[str] = set()
        """Transactions whose block is open."""
        self.returned: dict[str, set[bytes]] = {}
        """Transaction id -> the bodies whose send returned (the only ones that may be published)."""
        self.failed: set[bytes] = set()
        """Bodies whose every send raised: never published."""
        self.operator: dict[str, str] = {}
        """Transaction id -> the outcome an operator made stand."""
        self.database_down = False
        """While True, check-backs cannot read the database: they answer UNKNOWN."""
        self.failed_of: dict[str, set[bytes]] = {}
        """Transaction id -> the bodies whose send raised in its block."""
        self.unmarked_of: dict[str, set[bytes]] = {}
        """Transaction id -> the bodies whose send raised and could not be marked at once (Redis unreachable)."""
        self.died: set[str] = set()
        """Transactions whose process died before the end of their block."""
        self.decided_open: set[str] = set()
        """Transactions an operator decided while their block was open: a send that raised then follows that
        decision (too late to be voided), as its error says."""
        self.states: dict[str, State] = {}
        """Message transaction id -> its state as Redis showed it after the last step."""
        self.outer: dict[str, OuterTransaction] = {}
        """Transactions whose block ended while their log row waits in an outer database transaction (still
        running: a check-back waits on the row and answers UNKNOWN)."""

    # -- sends --------------------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        self.bodies += 1
        return b"m%d" % self.bodies

    def _lose_next_reply(self, before: bool = False) -> None:
        """The next script call runs on Redis (unless ``before``) and its reply is lost."""
        runner = self.producer.broker.runner
        run = runner.run

        def lost(*args: Any, **kwargs: Any) -> Any:
            runner.run = run
            if not before:
                run(*args, **kwargs)
            raise redis.ConnectionError("the reply was lost")

        runner.run = lost

    def _lose_next_rollback(self) -> None:
        """The producer's next end calls (the rollback of a send that failed) are lost with their connection."""
        broker = self.producer.broker

        def lost(ends: Any) -> Any:
            del broker.end_transactions
            raise TxMQConnectionError("connection reset")

        broker.end_transactions = lost

    def _restore(self) -> None:
        broker = self.producer.broker
        for name in ("run",):
            broker.runner.__dict__.pop(name, None)
        broker.__dict__.pop("end_transactions", None)

    @rule(
        target=singles,
        topic=st.sampled_from(TOPICS),
        fault=st.sampled_from(["none", "none", "lost", "refused", "unwoken"]),
    )
    def open_single(self, topic: str, fault: str) -> Any:
        """``unwoken``: the prepare is one of a producer that wakes its topic from the client (Cluster) and did
        not get to (or of a version that never does): the schedule does not know, a full pass finds it."""
        body = self._body()
        handle = self.producer.transaction(Message(topic, body, keys=body.decode()))
        broker = self.producer.broker
        if fault == "unwoken":
            broker._wake_in_script = False
            broker._wake = lambda *args: None
            self.unwoken |= {stream for stream in STREAMS if stream.partition("#")[0] == topic}
        elif fault != "none":
            self._lose_next_reply(before=fault == "refused")
        try:
            handle.__enter__()
        except PrepareError:
            self.failed.add(body)
            return None
        finally:
            self._restore()
            broker._wake_in_script = True
            broker.__dict__.pop("_wake", None)
        self.running.add(handle.transaction_id)
        self.returned[handle.transaction_id] = {body}
        return OpenSingle(handle, body)

    @rule(target=manys)
    def open_many(self) -> Any:
        handle = self.producer.transaction()
        handle.__enter__()
        self.running.add(handle.transaction_id)
        self.returned[handle.transaction_id] = set()
        return OpenMany(handle)

    @initialize(target=manys)
    def a_transaction_of_several_is_open(self) -> Any:
        """Every example starts with the block of a transaction of several messages open: its edges (sends that
        fail, decisions while it is open, its record) are within reach from the first step."""
        return self.open_many()

    @rule(
        many=manys,
        topic=st.sampled_from(TOPICS),
        fault=st.sampled_from(["none", "none", "lost", "lost_then_retried", "refused", "lost_unrolled"]),
        slow=st.booleans(),
        before=st.integers(0, 2),
    )
    def send(self, many: OpenMany | None, topic: str, fault: str, slow: bool, before: int = 0) -> None:
        """``tx.send`` in an open block (after ``before`` sends that return: blocks send several messages);
        ``slow``: the block then runs so long that the checks of the messages it sent so far run out (they are
        dead-lettered before it ends). ``lost_unrolled``: the reply is lost, the send is marked as failed, and the
        rollback of its half message is lost too (left to whoever ends it later)."""
        if many is None or many.transaction_id not in self.running:
            return
        try:
            for _ in range(before):
                self._send(many, topic, "none")
            self._send(many, topic, fault)
        finally:
            if slow:
                self.checks_run_out()

    def _send(self, many: OpenMany, topic: str, fault: str) -> None:
        body = self._body()
        message = Message(topic, body, keys=body.decode())
        if fault != "none":
            self._lose_next_reply(before=fault == "refused")
        if fault == "lost_unrolled":
            self._lose_next_rollback()
        try:
            many.handle.send(message)
        except PrepareError:
            self._restore()
            if fault != "lost_then_retried":
                self._failed_send(many, body)
                return
            try:
                many.handle.send(message)
            except PrepareError:
                self._failed_send(many, body)
                return
        finally:
            self._restore()
        self.returned[many.transaction_id].add(body)

    def _failed_send(self, many: OpenMany, body: bytes) -> None:
        self.failed.add(body)
        self.failed_of.setdefault(many.transaction_id, set()).add(body)

    @rule(many=manys, topic=st.sampled_from(TOPICS), retried=st.booleans(), round_between=st.booleans())
    def send_lost_and_unmarked(self, many: OpenMany | None, topic: str, retried: bool, round_between: bool) -> None:
        """A send whose reply is lost while Redis cannot be reached to mark it either; maybe a check round, then
        maybe the retry its error advises."""
        if many is None or many.transaction_id not in self.running:
            return
        body = self._body()
        message = Message(topic, body, keys=body.decode())
        broker = self.producer.broker
        self._lose_next_reply()

        def unreachable(*args: Any, **kwargs: Any) -> Any:
            del broker.decide
            raise TxMQConnectionError("Redis unreachable")

        broker.decide = unreachable
        try:
            many.handle.send(message)
            self.returned[many.transaction_id].add(body)
            return
        except PrepareError:
            pass
        finally:
            self._restore()
            broker.__dict__.pop("decide", None)
        if round_between:
            self._round()
        if retried:
            try:
                many.handle.send(message)
                self.returned[many.transaction_id].add(body)
                return
            except PrepareError:
                pass
        self._failed_send(many, body)
        self.unmarked_of.setdefault(many.transaction_id, set()).add(body)

    @rule(
        many=manys,
        topic=st.sampled_from(TOPICS),
        marked=st.booleans(),
        how=st.sampled_from(["commit", "ends_lost", "rollback"]),
    )
    def a_failed_send_then_the_block_ends(self, many: OpenMany | None, topic: str, marked: bool, how: str) -> None:
        """The narrow path of a send that can neither be marked nor rolled back, in one step: its reply is lost and
        Redis cannot be reached to mark it (``marked``: it is marked, but its rollback is lost), then the block ends
        (``ends_lost``: its ends after the decision are lost) and a check round runs."""
        if many is None or many.transaction_id not in self.running:
            return
        if marked:
            self._send(many, topic, "lost_unrolled")
        else:
            self.send_lost_and_unmarked(many, topic, retried=False, round_between=False)
        self._close(many.handle, many.transaction_id, how)
        self._round()

    @rule(many=manys)
    def decided_while_open(self, many: OpenMany | None) -> None:
        """An operator decides COMMIT while the block is still open (its messages follow it from then on)."""
        if many is None or many.transaction_id not in self.running:
            return
        self.producer.broker.decide(many.transaction_id, GROUP, COMMIT, EndSource.OPERATOR)
        self._operator_decided(many.transaction_id, "COMMIT")

    @rule(
        many=manys,
        topic=st.sampled_from(TOPICS),
        fault=st.sampled_from(["lost_then_retried", "lost", "none", "unmarked_then_retried"]),
    )
    def send_after_an_early_decision(self, many: OpenMany | None, topic: str, fault: str) -> None:
        """The narrow path of a decision made while the block is open, in one step: the decision, then the
        block's next send, which fails and may be retried (the retry must be refused: the failed send follows the
        decision), or cannot be marked and is retried."""
        if many is None or many.transaction_id not in self.running:
            return
        self.decided_while_open(many)
        if fault == "unmarked_then_retried":
            self.send_lost_and_unmarked(many, topic, retried=True, round_between=False)
        else:
            self._send(many, topic, fault)

    # -- ends ---------------------------------------------------------------------------------------------------

    def _commit_locally(self, transaction_id: str) -> bool:
        """The local transaction's database commit; False when a check-back fenced it first."""
        if self.local.get(transaction_id) == "FENCED":
            return False
        self.local[transaction_id] = "COMMIT"
        return True

    @rule(
        single=consumes(singles),
        how=st.sampled_from(["commit", "rollback", "end_lost", "dies_before_commit", "dies_after_commit"]),
    )
    def close_single(self, single: OpenSingle | None, how: str) -> None:
        if single is None:
            return
        self._close(single.handle, single.transaction_id, how)

    @rule(
        many=consumes(manys),
        how=st.sampled_from(["commit", "rollback", "ends_lost", "dies_before_commit", "dies_after_commit"]),
    )
    def close_many(self, many: OpenMany | None, how: str) -> None:
        if many is None or many.transaction_id not in self.running:  # ended already (a_failed_send_then_the_block_ends)
            return
        self._close(many.handle, many.transaction_id, how)

    @rule(single=consumes(singles))
    def close_single_in_an_outer_transaction(self, single: OpenSingle | None) -> None:
        if single is not None:
            self._close_in_an_outer_transaction(single.handle, single.transaction_id)

    @rule(many=consumes(manys))
    def close_many_in_an_outer_transaction(self, many: OpenMany | None) -> None:
        if many is not None and many.transaction_id in self.running:
            self._close_in_an_outer_transaction(many.handle, many.transaction_id)

    def _close_in_an_outer_transaction(self, handle: Any, transaction_id: str) -> None:
        """The block ends normally, its log row in an outer transaction still open: nothing may be published until
        that transaction commits (defect: the handle committed here, before the database did)."""
        outer = OuterTransaction()
        watch_row(transaction_id, outer, handle)
        handle.__exit__(None, None, None)
        self.outer[transaction_id] = outer

    @rule(pick=st.integers(0, 7), how=st.sampled_from(["commit", "rollback", "dies_after_commit", "dies_before"]))
    def outer_transaction_ends(self, pick: int, how: str) -> None:
        """The outer transaction commits (the deferred COMMIT goes out), rolls back (the check-back fences it), or
        its process dies before or after its commit (the check-back decides from the row)."""
        if not self.outer:
            return
        transaction_id = sorted(self.outer)[pick % len(self.outer)]
        outer = self.outer.pop(transaction_id)
        self.running.discard(transaction_id)
        if how.startswith("dies"):
            self.died.add(transaction_id)
        if how in ("rollback", "dies_before") or not self._commit_locally(transaction_id):
            outer.rolls_back()
            return
        if how == "commit":
            outer.commits()

    def _close(self, handle: Any, transaction_id: str, how: str) -> None:
        self.running.discard(transaction_id)
        if how.startswith("dies"):
            self.died.add(transaction_id)
        if how == "dies_before_commit":
            return  # the process is gone: nothing decided, nothing ended
        if how == "rollback":
            handle.__exit__(Refused, Refused("refused"), None)
            return
        committed = self._commit_locally(transaction_id)
        if how == "dies_after_commit":
            return
        if how == "end_lost":
            self._lose_next_reply()
        if how == "ends_lost":
            broker = self.producer.broker

            def lost(ends: Any) -> Any:
                raise TxMQConnectionError("the producer died after its decision")

            broker.end_transactions = lost
        try:
            if committed:
                handle.__exit__(None, None, None)
            else:
                handle.__exit__(Refused, Refused("the database refused the commit: fenced"), None)
        finally:
            self._restore()

    # -- the check-back ------------------------------------------------------------------------------------------

    def _round(self) -> None:
        """A check round once the server's clock has passed ``check_interval`` (1 ms) since the last one, so that
        what is due does not depend on how fast this machine runs the steps."""
        while self._server_ms() <= self.last_round_ms + 1:
            pass
        self.checker.run_round()
        assert not self.checker._legacy, "the checker took its own producer for one of an earlier layout"
        self.last_round_ms = self._server_ms()

    def _server_ms(self) -> int:
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000

    @rule(down=st.booleans())
    def database_reachable(self, down: bool) -> None:
        self.database_down = down

    @rule()
    def check_round(self) -> None:
        self._round()

    @rule(target=singles, topic=st.sampled_from(TOPICS))
    def prepare_during_a_round(self, topic: str) -> Any:
        """A transaction is prepared while a check round runs: after the round looked at the topics, before it
        writes what it saw to the schedule (which must not drop the wake of a prepare it did not see)."""
        broker = self.checker.broker
        write = broker.schedule_topics
        opened: list[Any] = []

        def prepare_first(looks: Any) -> Any:
            opened.append(self.open_single(topic, "none"))
            return write(looks)

        broker.schedule_topics = prepare_first
        try:
            self._round()
        finally:
            broker.__dict__.pop("schedule_topics", None)
        return opened[0] if opened else None

    @rule()
    def full_pass(self) -> None:
        """A round that is also a full pass over every registered topic (what finds what the schedule missed)."""
        self.checker._next_full_pass = 0.0
        self._round()
        self.unwoken.clear()

    @rule()
    def check_cycle(self) -> None:
        """A check interval passes with the producer group serving its checks: a round, the answers, a round."""
        self._round()
        self.answer_checks()
        self._round()

    @rule()
    def checks_run_out(self) -> None:
        """Long enough passes for every transaction in flight to use up its checks (``check_max``)."""
        for _ in range(SETTINGS.check_max + 1):
            self.check_cycle()

    @rule()
    def answer_checks(self) -> None:
        """The producer group answers every check request waiting now (what its reader thread would do)."""
        reply = self.client.xreadgroup(
            PRODUCERS_CONSUMER_GROUP, self.handler.instance_id, {GroupKeys(GROUP).check_requests: ">"}, count=1000
        )
        for _, batch in reply or []:
            for request_id, raw in batch:
                self.handler._answer(request_id.decode(), raw)

    @rule(pick=st.integers(0, 7), action=st.sampled_from(list(DeadAction)))
    def operator_resolves(self, pick: int, action: DeadAction) -> None:
        dead = [letter["transaction_id"] for letter in dead_letters(self.client)]  # in stream order: reproducible
        if not dead:
            return
        transaction_id = dead[pick % len(dead)]
        try:
            parent, _ = resolve_dead_transaction(self.checker.broker, transaction_id, action)
        except TransactionConflictError:
            return
        if action is not DeadAction.RECHECK:
            self._operator_decided(parent or transaction_id, action.value)

    @rule()
    def round_with_a_failed_burial(self) -> None:
        """A check round whose burials fail (a dropped connection): the messages stay in flight."""
        broker = self.checker.broker

        def dropped(*args: Any, **kwargs: Any) -> Any:
            raise TxMQConnectionError("connection reset")

        broker.bury_half = dropped
        try:
            self._round()
        finally:
            broker.__dict__.pop("bury_half", None)

    @rule(step=st.sampled_from(["XDEL", "XADD"]), how=st.sampled_from(["raised", "refused"]))
    def round_whose_check_requests_fail(self, step: str, how: str) -> None:
        """A check round whose deletes of the requests it replaces (XDEL) or whose new requests (XADD) fail: the
        pipeline raises (a dropped connection, a failover) or the server refuses each command (out of memory). The
        round's checks are not sent, their count is given back, the checker goes on. Only the pipelines that write
        the group's check request stream fail: the round's other pipelines (its ack of the answers it applied, its
        reads) go through."""
        execute = redis.client.Pipeline.execute
        requests = GroupKeys(GROUP).check_requests

        def writes_requests(command: Any) -> bool:
            name, key = command[0][0], command[0][1] if len(command[0]) > 1 else b""
            return name == step and (key.decode() if isinstance(key, bytes) else str(key)) == requests

        def failing(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            if not any(writes_requests(command) for command in pipe.command_stack):
                return execute(pipe, *args, **kwargs)
            count = len(pipe.command_stack)
            pipe.reset()
            if how == "raised":
                raise redis.ConnectionError("connection lost")
            return [redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")] * count

        redis.client.Pipeline.execute = failing  # type: ignore[method-assign]
        try:
            self._round()
        finally:
            redis.client.Pipeline.execute = execute  # type: ignore[method-assign]

    @rule(pick=st.integers(0, 7), action=st.sampled_from([DeadAction.COMMIT, DeadAction.ROLLBACK]))
    def operator_crashes_before_releasing(self, pick: int, action: DeadAction) -> None:
        """``txmq dead commit|rollback`` resolves, then its process dies before it releases the record; the
        operator runs it again (what the README says to do after an interruption). A dead letter of a transaction of
        several messages when there is one: only those have a record to release."""
        letters = [letter["transaction_id"] for letter in dead_letters(self.client)]
        dead = [txid for txid in letters if "." in txid] or letters
        if not dead:
            return
        transaction_id = dead[pick % len(dead)]
        broker = self.checker.broker
        decide = broker.decide

        def dies_on_release(parent: str, group: str, act: Any, source: Any, indices: Any = (), **kw: Any) -> Any:
            if act is RecordAction.UNPIN:
                raise TxMQConnectionError("the operator's process died")
            return decide(parent, group, act, source, indices, **kw)

        broker.decide = dies_on_release
        try:
            parent, _ = resolve_dead_transaction(broker, transaction_id, action)
        except TransactionConflictError:
            return
        except TxMQConnectionError:
            broker.__dict__.pop("decide", None)
            parent, _ = resolve_dead_transaction(broker, transaction_id, action)
        finally:
            broker.__dict__.pop("decide", None)
        self._operator_decided(parent or transaction_id, action.value)

    def _may_follow(self, parent: str) -> set[bytes]:
        """Bodies of failed sends that may follow their transaction's decision (README): all of them once it was
        decided while the block was open; those that could not be marked when the process then died."""
        if parent in self.decided_open:
            return self.failed_of.get(parent, set())
        if parent in self.died:
            return self.unmarked_of.get(parent, set())
        return set()

    def _operator_decided(self, transaction_id: str, outcome: str) -> None:
        self.operator.setdefault(transaction_id, outcome)
        if transaction_id in self.running:
            self.decided_open.add(transaction_id)

    @rule()
    def records_expire(self) -> None:
        """Time passes beyond the records' lifetime (``max_age`` and the dedupe window): every record of a
        transaction of several messages that has a time to live, no message in flight and no block open (none stays
        open that long) is gone, as its expiry would have it."""
        for key in self.client.scan_iter(match="txmq:decision:*"):
            if self.client.pttl(key) <= 0:
                continue
            parent = key.decode().partition("{")[2].rstrip("}")
            if parent in self.running:
                continue
            if not any(self._in_flight(stream, parent + ".*") for stream in STREAMS):
                self.client.delete(key)

    def _in_flight(self, stream: str, match: str) -> int:
        return sum(1 for _ in self.client.hscan_iter(topic_keys_of_stream(stream).inflight, match=match))

    # -- what must hold ------------------------------------------------------------------------------------------

    def visible(self) -> list[tuple[str, bytes]]:
        return [
            (fields[b"transaction_id"].decode(), fields[b"body"])
            for stream in STREAMS
            for _, fields in self.client.xrange(stream)
        ]

    @staticmethod
    def transaction_of(message_transaction_id: str) -> str:
        return message_transaction_id.partition(".")[0]

    @invariant()
    def a_decision_stands_while_a_message_of_it_is_dead_lettered(self) -> None:
        """SPEC §5: the decision of a transaction of several messages stands for as long as a dead letter of it
        exists: the record of a transaction with a dead-lettered message does not expire, and once a message of it
        is published the record says COMMIT."""
        published = {self.transaction_of(txid) for txid, _ in self.visible() if "." in txid}
        for letter in dead_letters(self.client):
            txid = letter["transaction_id"]
            if "." not in txid:
                continue
            parent = self.transaction_of(txid)
            record = decision_key(parent)
            assert self.client.pttl(record) == -1, f"{txid} is dead-lettered and the record of {parent} expires"
            if parent in published:
                assert self.client.hget(record, "outcome") == b"COMMIT", (
                    f"{txid} is dead-lettered, {parent} published, and its decision is gone"
                )

    @invariant()
    def every_change_of_state_is_a_move_of_the_table(self) -> None:
        """Each message's state as Redis shows it (in flight, dead-lettered, published; gone after one of these:
        rolled back) changes between two steps only along the moves of ``redis_txmq.core.states`` (the table the
        docs' diagram is drawn from): nothing leaves COMMITTED or ROLLED_BACK, nothing is published or checked
        again after it was rolled back."""
        now: dict[str, State] = {}
        for stream in STREAMS:
            for field, _ in self.client.hscan_iter(topic_keys_of_stream(stream).inflight):
                now[field.decode()] = State.IN_FLIGHT
        for letter in dead_letters(self.client):
            now[letter["transaction_id"]] = State.DEAD_LETTERED
        for txid, _ in self.visible():
            now[txid] = State.COMMITTED
        for txid, before in self.states.items():
            after = now.get(txid, State.ROLLED_BACK)
            assert after in reachable(before), (
                f"{txid} went from {before.value} to {after.value}: no path of the table of states"
            )
        self.states = {**dict.fromkeys(self.states, State.ROLLED_BACK), **now}

    @invariant()
    def the_schedule_covers_what_is_in_flight(self) -> None:
        """The checkers' schedule holds every topic with a transaction in flight at or before its earliest check due
        (its first unchecked one's birth plus ``transaction_timeout``, or its first next check; any time not after
        now, for a check already due): a round that follows the schedule alone misses no check-back. Not for a
        topic a prepare did not wake, until a full pass."""
        timeout_ms = SETTINGS.transaction_timeout * 1000
        for stream in STREAMS:
            if stream in self.unwoken:
                continue
            keys = topic_keys_of_stream(stream)
            due = [score + timeout_ms for _, score in self.client.zrange(keys.unchecked, 0, 0, withscores=True)]
            due += [score for _, score in self.client.zrange(keys.due, 0, 0, withscores=True)]
            if not due:
                continue
            scheduled = self.client.zscore(SCHEDULE, stream)
            # a score in the past is "due now" whatever its value (a wake may raise it to its prepare's time)
            assert scheduled is not None and scheduled <= max(min(due), self._server_ms()), (
                f"{stream} has a check due at {min(due):.0f} ms and the schedule holds it at {scheduled}"
            )

    @invariant()
    def nothing_twice_nothing_unasked(self) -> None:
        seen = self.visible()
        bodies = [body for _, body in seen]
        assert len(bodies) == len(set(bodies)), f"a message published twice: {sorted(bodies)}"
        assert len(seen) == len({txid for txid, _ in seen}), "a transaction id published twice"
        for txid, body in seen:
            parent = self.transaction_of(txid)
            assert self.local.get(parent) == "COMMIT" or self.operator.get(parent) == "COMMIT", (
                f"{body!r} of {parent} published, but neither its local transaction nor an operator committed it"
            )
            if "." not in txid and self.operator.get(parent) == "COMMIT":
                continue  # an operator committed the dead letter of a send that raised: the operator decides
            assert body in self.returned.get(parent, set()) | self._may_follow(parent), (
                f"{body!r} published although its send raised"
            )

    def check_now(self) -> None:
        """Every invariant, as hypothesis checks them after each step (for the pinned programs)."""
        self.a_decision_stands_while_a_message_of_it_is_dead_lettered()
        self.every_change_of_state_is_a_move_of_the_table()
        self.the_schedule_covers_what_is_in_flight()
        self.nothing_twice_nothing_unasked()

    def teardown(self) -> None:
        try:
            self._settle()
            self._all_or_nothing()
        finally:
            self.close()

    def close(self) -> None:
        self.producer._state = "shut down"
        self.producer.broker.close()
        self.checker.broker.close()

    def _settle(self) -> None:
        """Until nothing is in flight: abandon open blocks (their processes died), run check rounds, answer, and
        resolve dead letters as an operator who knows the truth (the other way when a decision already stands)."""
        self.running.clear()
        self.database_down = False
        self.full_pass()
        for _ in range(60):
            self.check_cycle()
            for letter in dead_letters(self.client):
                txid = letter["transaction_id"]
                parent = self.transaction_of(txid)
                truth = DeadAction.COMMIT if self.local.get(parent) == "COMMIT" else DeadAction.ROLLBACK
                try:
                    resolve_dead_transaction(self.checker.broker, txid, truth)
                    self.operator.setdefault(parent, truth.value)
                except TransactionConflictError:
                    other = DeadAction.ROLLBACK if truth is DeadAction.COMMIT else DeadAction.COMMIT
                    resolve_dead_transaction(self.checker.broker, txid, other)
                    self.operator.setdefault(parent, other.value)
                except TransactionError:
                    pass
            if not any(self._in_flight(s, "*") for s in STREAMS) and not dead_letters(self.client):
                break
        else:
            raise AssertionError("transactions still in flight after 60 check rounds")

    def _all_or_nothing(self) -> None:
        visible: dict[str, set[bytes]] = {}
        for txid, body in self.visible():
            visible.setdefault(self.transaction_of(txid), set()).add(body)
        for parent, returned in self.returned.items():
            shown = visible.get(parent, set())
            committed = self.operator.get(parent, "COMMIT" if self.local.get(parent) == "COMMIT" else "ROLLBACK")
            if committed == "COMMIT" and self.operator.get(parent) != "ROLLBACK":
                assert returned <= shown <= returned | self._may_follow(parent), (
                    f"transaction {parent} committed, but shows {sorted(shown)} of {sorted(returned)}"
                )
            else:
                assert not shown, f"transaction {parent} rolled back, but shows {sorted(shown)}"
        for parent, failed in self.failed_of.items():
            shown_failed = failed & visible.get(parent, set()) - self._may_follow(parent)
            assert not shown_failed, f"{sorted(shown_failed)} published although their send raised"
        for stream in STREAMS:
            keys = topic_keys_of_stream(stream)
            assert self.client.xlen(keys.half_stream) == 0 if self.client.exists(keys.half_stream) else True
            for key in (keys.inflight, keys.checks, keys.check_requests):
                assert self.client.hlen(key) == 0, f"{key} not empty at quiescence"
            for key in (keys.unchecked, keys.due):
                assert self.client.zcard(key) == 0, f"{key} not empty at quiescence"
        assert self.client.xlen(GroupKeys(GROUP).check_requests) == 0, "check requests left at quiescence"
        for key in self.client.scan_iter(match="txmq:decision:*"):
            assert self.client.pttl(key) > 0, f"{key!r} kept for ever with nothing dead-lettered"


PINNED = Programs()
"""The known defect shapes, as explicit programs of the model's rules: each once found a defect (the patch of
``tests/model_defects/`` it names re-introduces it), and runs in every run whatever the random search draws."""


@PINNED.pin
def a_retry_after_an_early_decision(s: Steps) -> None:
    """An operator decides COMMIT while the block is open; the next send's reply is lost (its half follows the
    decision) and the caller retries it: the retry must be refused, else the body is published twice (01)."""
    many = s.open_many()
    s.send(many=many, topic="orders", fault="none", slow=False)
    s.decided_while_open(many=many)
    s.send(many=many, topic="audit", fault="lost_then_retried", slow=False)
    s.close_many(many=many, how="commit")
    s.check_cycle()


@PINNED.pin
def an_operator_run_again_releases_the_record(s: Steps) -> None:
    """The checks of two messages run out while their block is open (both dead-lettered, the record pinned); the
    operator's commit dies before it releases the record and is run again naming one of them; the producer dies
    too (its ends would have let go): the record must let go of both, or it is kept for ever (02)."""
    many = s.open_many()
    s.send(many=many, topic="orders", fault="none", slow=False)
    s.send(many=many, topic="audit", fault="none", slow=True)
    s.operator_crashes_before_releasing(pick=0, action=DeadAction.COMMIT)
    s.close_many(many=many, how="dies_before_commit")


@PINNED.pin
def the_record_outlives_a_dead_letter(s: Steps) -> None:
    """A message is dead-lettered, another published by the commit; records expire, then an operator rolls the
    dead letter back: the record must still stand (COMMIT), or half the transaction is visible (03)."""
    many = s.open_many()
    s.send(many=many, topic="orders", fault="none", slow=True)
    s.send(many=many, topic="audit", fault="none", slow=False)
    s.close_many(many=many, how="commit")
    s.records_expire()
    s.operator_resolves(pick=0, action=DeadAction.ROLLBACK)


@PINNED.pin
def a_send_neither_marked_nor_rolled_back(s: Steps) -> None:
    """A send whose reply is lost while Redis cannot be reached to mark it; the block commits: the decision must
    carry the failed send, which is then rolled back, never published (04)."""
    many = s.open_many()
    s.send(many=many, topic="orders", fault="none", slow=False)
    s.send_lost_and_unmarked(many=many, topic="audit", retried=False, round_between=False)
    s.close_many(many=many, how="commit")
    s.check_cycle()


@PINNED.pin
def a_failed_send_whose_rollback_is_lost(s: Steps) -> None:
    """A send fails and is marked, but its rollback is lost, and so are the ends after the COMMIT decision: the
    checker must end the failed send's half with ROLLBACK (the record voids it), the other with COMMIT (05)."""
    many = s.open_many()
    s.send(many=many, topic="orders", fault="none", slow=False)
    s.send(many=many, topic="audit", fault="lost_unrolled", slow=False)
    s.close_many(many=many, how="ends_lost")
    s.check_cycle()


@PINNED.pin
def a_round_whose_retire_of_requests_fails(s: Steps) -> None:
    """A check request goes unanswered; the next round's delete of it (the request it replaces) raises: the
    checker goes on (06)."""
    s.open_single(topic="orders", fault="none")
    s.check_round()
    s.round_whose_check_requests_fail(step="XDEL", how="raised")
    s.check_round()


@PINNED.pin
def a_block_ends_inside_an_outer_transaction(s: Steps) -> None:
    """A block ends while its log row waits in an outer database transaction, which then rolls back: nothing may be
    published before that transaction commits, and nothing once it rolled back (14)."""
    single = s.open_single(topic="orders", fault="none")
    s.close_single_in_an_outer_transaction(single=single)
    s.check_cycle()
    s.outer_transaction_ends(pick=0, how="rollback")
    s.check_cycle()


@pytest.fixture
def model_client(redis_url: str) -> Iterator[redis.Redis]:
    """The session's server, where the machine finds it."""
    global CLIENT
    CLIENT = redis.Redis.from_url(redis_url)
    try:
        yield CLIENT
    finally:
        CLIENT.close()
        CLIENT = None


@pytest.mark.parametrize("program", sorted(PINNED))
def test_pinned_program_holds(model_client: redis.Redis, program: str) -> None:
    PINNED.run(program, ProtocolModel())


@pytest.mark.timeout(900)
def test_the_protocol_holds_against_its_model(model_client: redis.Redis) -> None:
    run_state_machine_as_test(
        ProtocolModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=40,
            deadline=None,
            derandomize=not RANDOM,
            phases=PHASES,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
