"""The lifetimes of what the library keeps, named per thing (``Settings.transaction_record_lifetime``,
``job_decision_lifetime``, ``stage_lifetime``): each defaults to ``max_age`` plus the dedupe window, as the one
lifetime they shared did, can be set apart, and reaches the keys it names."""

from __future__ import annotations

import msgpack
import pytest

from redis_txmq import ConfigurationError, LocalTransactionState, Message, Settings, TransactionProducer
from redis_txmq.core.keys import decision_key, published_key
from redis_txmq.jobs import STAGE_ROWS_FIELD, WriteJob

from .helpers import ScriptedListener

COMMIT = LocalTransactionState.COMMIT


def test_each_lifetime_defaults_to_max_age_plus_the_dedupe_window():
    settings = Settings(max_age=60, dedupe_window=90)
    assert settings.kept_ms == 150_000
    assert settings.transaction_record_lifetime_ms == 150_000
    assert settings.job_decision_lifetime_ms == 150_000
    assert settings.stage_lifetime_ms == 150_000


def test_lifetimes_are_set_apart_and_from_the_environment():
    settings = Settings.from_env(
        {"TXMQ_TRANSACTION_RECORD_LIFETIME": "400000", "TXMQ_STAGE_LIFETIME": "3600"}, job_decision_lifetime=7200
    )
    assert settings.transaction_record_lifetime_ms == 400_000_000
    assert (settings.job_decision_lifetime_ms, settings.stage_lifetime_ms) == (7_200_000, 3_600_000)
    with pytest.raises(ConfigurationError, match="TXMQ_STAGE_LIFETIME"):
        Settings.from_env({"TXMQ_STAGE_LIFETIME": "a day"})


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"stage_lifetime": 0}, "stage_lifetime must be > 0"),
        ({"transaction_record_lifetime": 60}, "at least max_age plus dedupe_window"),
        ({"job_decision_lifetime": 3600}, "stage_lifetime .* must not be longer than job_decision_lifetime"),
        ({"stage_lifetime": 7200, "job_decision_lifetime": 3600}, "must not be longer than job_decision_lifetime"),
    ],
)
def test_lifetimes_that_would_lose_a_record_are_refused(given, refused):
    with pytest.raises(ConfigurationError, match=refused):
        Settings(**given)


def test_a_transaction_record_lives_its_lifetime(real_client):
    settings = Settings(max_age=60, dedupe_window=60, transaction_record_lifetime=1000)
    with TransactionProducer("order_group", ScriptedListener(), client=real_client, settings=settings) as producer:
        with producer.transaction() as tx:
            tx.send(Message("orders", b"1"))
            tx.send(Message("invoices", b"2"))
    assert 120_000 < real_client.pttl(decision_key(tx.transaction_id)) <= 1_000_000


def test_a_write_job_and_its_stages_live_their_lifetimes(real_client):
    settings = Settings(max_age=60, dedupe_window=60, job_decision_lifetime=500, stage_lifetime=400)
    job = WriteJob.new(real_client, settings)
    try:
        stage = job.stage("orders", "p0")
        assert stage is not None
        assert 400_000 < real_client.pttl(job.keys.decision) <= 500_000, "the record while undecided"
        assert 120_000 < real_client.pttl(stage) <= 400_000
        assert 120_000 < real_client.pttl(job.keys.stages) <= 400_000
        real_client.xadd(stage, {STAGE_ROWS_FIELD: msgpack.packb([["body", "b"]])}, nomkstream=True)
        assert job.commit({stage: 1}).outcome is COMMIT
        assert 400_000 < real_client.pttl(job.keys.decision) <= 500_000, "the job decision"
        assert 400_000 < real_client.pttl(published_key(stage)) <= 500_000, "what the stage published"
    finally:
        job.close()
