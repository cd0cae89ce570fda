"""One registry of open transactions for the process: a handle recorded with the SQLAlchemy log is open for the
Django log's check-back, and one recorded with the Django log for the SQLAlchemy log's. A service may record with one
and answer check-backs with the other (a Django app beside SQLAlchemy code, a migration from one to the other); a
check of a slow local transaction still running here must answer UNKNOWN, not fence it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.db import transaction
from sqlalchemy import MetaData, create_engine, select

from redis_txmq import LocalTransactionState, Message, TransactionProducer
from redis_txmq.django import TransactionLog as DjangoLog
from redis_txmq.django.models import TransactionLogEntry
from redis_txmq.sqlalchemy import TransactionLog as SqlAlchemyLog

COMMIT, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.UNKNOWN


def slow_check(transaction_id: str) -> Message:
    """A check-back of a transaction whose half message is older than ``local_transaction_max_seconds``: without an
    open handle here, the log would fence it."""
    message = Message("orders", b"{}", transaction_id=transaction_id)
    message.prepared_at = time.time() - 3600
    return message


def sqlalchemy_log_on(tmp_path: Path) -> tuple[SqlAlchemyLog, Any]:
    """A SQLAlchemy log and its engine, on a SQLite database of its own (not the Django one)."""
    metadata = MetaData()
    log = SqlAlchemyLog(metadata, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    engine = create_engine(f"sqlite:///{tmp_path / 'sqlalchemy.db'}")
    metadata.create_all(engine)
    return log, engine


def test_a_handle_recorded_with_the_sqlalchemy_log_is_open_for_the_django_log(
    django_database: str, tmp_path: Path, real_client: Any, redis_url: str
) -> None:
    """Defect: the Django log kept a registry of its own, so it fenced (ROLLBACK) a transaction the SQLAlchemy log
    had recorded and whose block was still open here."""
    recording, engine = sqlalchemy_log_on(tmp_path)
    answering = DjangoLog(using=django_database, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    try:
        with TransactionProducer("order_group", checker=recording.checker(engine), redis_url=redis_url) as p:
            with p.transaction(Message("orders", b"1")) as tx, engine.begin() as db:
                db.execute(recording.record(tx))
                assert answering.check(slow_check(tx.transaction_id)) is UNKNOWN, "its block is open here"
        with engine.connect() as db:
            state = db.execute(select(recording.table.c.state)).scalar_one()
    finally:
        engine.dispose()
    assert state == "COMMIT" and tx.result.local_transaction_state is COMMIT
    assert not TransactionLogEntry.objects.using(django_database).exists(), "no fence written"


def test_a_handle_recorded_with_the_django_log_is_open_for_the_sqlalchemy_log(
    django_database: str, tmp_path: Path, real_client: Any, redis_url: str
) -> None:
    """Defect: the SQLAlchemy log kept a registry of its own, so it fenced (ROLLBACK) a transaction the Django log
    had recorded and whose block was still open here."""
    recording = DjangoLog(using=django_database, local_transaction_max_seconds=30, lock_timeout_seconds=2)
    answering, engine = sqlalchemy_log_on(tmp_path)
    try:
        with TransactionProducer("order_group", checker=recording.checker(), redis_url=redis_url) as p:
            with p.transaction(Message("orders", b"1")) as tx, transaction.atomic(using=django_database):
                recording.record(tx)
                assert answering.check(engine, slow_check(tx.transaction_id)) is UNKNOWN, "its block is open here"
        with engine.connect() as db:
            assert db.execute(select(answering.table.c.state)).all() == [], "no fence written"
    finally:
        engine.dispose()
    state = TransactionLogEntry.objects.using(django_database).get(pk=tx.transaction_id).state
    assert state == "COMMIT" and tx.result.local_transaction_state is COMMIT
