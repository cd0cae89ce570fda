"""The web console (``txmq console``) on a real Redis, through Starlette's test client: its overview shows
``txmq status``'s numbers, its pages page, sort, filter and find, its one action (resolving dead letters) needs a
login, a CSRF token and a confirmation, runs what ``txmq dead`` runs and is audited; it is read-only without an
operator token, shows no password, answers bad input with an error page, works under the read-only ``console`` ACL
user, and outlives Redis going away."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redis_txmq import LocalTransactionState, Message, Settings
from redis_txmq.checker import Checker
from redis_txmq.core.errors import TxMQError
from redis_txmq.core.keys import AUDIT_STREAM, TopicKeys
from redis_txmq.ops import admin
from redis_txmq.ops.acl import acl_rules
from redis_txmq.sync.broker import EndSource, RedisBroker
from redis_txmq.transport.embedded import EmbeddedRedis, free_port, server_binary, wait_for_ping

from .helpers import wait_until

pytest.importorskip("starlette")
pytest.importorskip("multipart")
from starlette.testclient import TestClient  # noqa: E402

from redis_txmq.ops.console.app import create_app  # noqa: E402
from redis_txmq.ops.console.queries import ConsoleOptions  # noqa: E402

pytestmark = pytest.mark.real

TOKEN = "s3cret-operator-token"
GROUP = "orders-service"
SETTINGS = Settings(transaction_timeout=0, check_interval=0.05, check_max=1)
COMMIT, ROLLBACK = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK
FAST = ConsoleOptions(refresh_seconds=0)


def seed(client: redis.Redis) -> dict[str, str]:
    """Demo-like data: committed and rolled back orders, one dead-lettered payment, one order left in flight, a
    consumer group on the orders. Returns the ids by role."""
    broker = RedisBroker(client, SETTINGS)
    broker.load_scripts()
    orders, payments = TopicKeys("orders"), TopicKeys("payments")
    ids = {}
    for i, outcome in enumerate([COMMIT, COMMIT, ROLLBACK, COMMIT]):
        txid = f"tx-order-{i}"
        broker.prepare_half(orders, Message("orders", f"order {i}".encode(), keys=f"order-{i}"), txid, GROUP)
        broker.end_transaction(orders, txid, GROUP, outcome, source=EndSource.PRODUCER)
    ids["committed"], ids["rolled_back"] = "tx-order-0", "tx-order-2"
    broker.prepare_half(payments, Message("payments", b"pay", keys="order-9"), "tx-dead", GROUP)
    checker = Checker(client, SETTINGS)

    def dead_lettered() -> bool:
        checker.run_round()
        return bool(client.hexists(payments.dead_index, "tx-dead"))

    wait_until(dead_lettered)
    ids["dead"] = "tx-dead"
    broker.prepare_half(orders, Message("orders", b"open", keys="order-open"), "tx-open", GROUP)
    ids["in_flight"] = "tx-open"
    client.xgroup_create("orders", "billing", id="0")
    return ids


@pytest.fixture
def seeded(real_client: redis.Redis) -> dict[str, str]:
    return seed(real_client)


LOCAL = "http://127.0.0.1"
"""The console answers requests naming it by a local name (or an allowed host), not the test client's default."""


def console(client: Any, token: str | None = TOKEN, **kwargs: Any) -> TestClient:
    app = create_app(client, SETTINGS, operator_token=token, options=kwargs.pop("options", FAST), **kwargs)
    return TestClient(app, raise_server_exceptions=False, base_url=LOCAL)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def log_in(web: TestClient, name: str = "alice") -> None:
    csrf = csrf_of(web.get("/login").text)
    response = web.post("/login", data={"csrf": csrf, "operator": name, "token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303, response.text


def without_ages(value: Any) -> Any:
    """A report with its ages (which grow between two reads) left out."""
    if isinstance(value, dict):
        return {k: without_ages(v) for k, v in value.items() if not k.endswith(("age_seconds", "idle_seconds"))}
    if isinstance(value, list):
        return [without_ages(v) for v in value]
    return value


def test_the_overview_shows_the_numbers_of_txmq_status(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client)
    overview = web.get("/api/overview").json()
    report = admin.status(real_client, live_seconds=SETTINGS.heartbeat_interval * 3)
    for name, value in report.items():
        assert without_ages(overview[name]) == without_ages(value), name
    assert overview["totals"] == {"topics": 2, "streams": 2, "committed": 3, "in_flight": 1, "dead_letters": 1}
    assert overview["attention"]["dead_letters"] == 1
    assert set(overview["rates"]["series"]) == {"committed", "rolled_back", "check_backs", "dead_lettered"}
    assert overview["rates"]["counts"] == {"committed": 3, "rolled_back": 1, "check_backs": 0, "dead_lettered": 1}

    page = web.get("/")
    assert page.status_code == 200
    assert re.search(r'data-testid="total-committed">3<', page.text)
    assert re.search(r'data-testid="total-dead-letters">1<', page.text)
    live = web.get("/", headers={"HX-Request": "true"})
    assert live.status_code == 200 and "<html" not in live.text and 'data-testid="total-committed"' in live.text


def test_a_transaction_in_flight_past_the_bound_and_one_checked_often_need_a_person(
    real_client: redis.Redis, seeded: dict[str, str]
) -> None:
    real_client.hset(TopicKeys("orders").checks, "tx-open", 5)
    real_client.hset(TopicKeys("orders").remarks, "tx-open", "UNKNOWN: still waiting for the bank")
    options = ConsoleOptions(refresh_seconds=0, in_flight_bound_seconds=0, unknown_checks=3)
    attention = console(real_client, options=options).get("/api/overview").json()["attention"]
    assert [r["transaction_id"] for r in attention["in_flight_past_bound"]] == ["tx-open"]
    assert attention["keep_answering_unknown"] == [
        {"stream": "orders", "transaction_id": "tx-open", "checks": 5, "remark": "UNKNOWN: still waiting for the bank"}
    ]


def test_topics_page_sort_and_filter_at_300_topics(real_client: redis.Redis) -> None:
    pipe = real_client.pipeline(transaction=False)
    for i in range(300):
        name = f"topic-{i:03d}"
        pipe.sadd("txmq:topics", name)
        for _ in range(i % 7):
            pipe.xadd(name, {"transaction_id": f"t{i}", "body": b"x"})
    pipe.execute()
    web = console(real_client, token=None)
    first = web.get("/api/topics", params={"size": 50}).json()
    assert (first["total"], first["pages"], len(first["rows"])) == (300, 6, 50)
    assert first["rows"][0]["topic"] == "topic-000"
    last = web.get("/api/topics", params={"size": 50, "page": 6}).json()
    assert [r["topic"] for r in last["rows"]][-1] == "topic-299"
    assert web.get("/api/topics", params={"size": 7}).json()["pages"] == 43
    by_committed = web.get("/api/topics", params={"sort": "committed", "order": "desc", "size": 10}).json()
    assert all(r["committed"] == 6 for r in by_committed["rows"])
    assert by_committed["rows"][0]["topic"] == "topic-006"  # ties by name
    filtered = web.get("/api/topics", params={"q": "topic-29"}).json()
    assert [r["topic"] for r in filtered["rows"]] == [f"topic-29{i}" for i in range(10)]
    html = web.get("/topics", params={"q": "topic-29", "size": 4}).text
    assert html.count('data-testid="topic-row"') == 4 and 'data-pages="3"' in html


def test_a_topic_shows_its_groups_messages_and_half_messages(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client)
    topic = web.get("/api/topics/orders", params={"size": 2}).json()
    assert [g["group"] for g in topic["consumer_groups"]] == ["billing"]
    assert topic["consumer_groups"][0]["undelivered"] == 3
    assert [m["transaction_id"] for m in topic["committed_messages"]["rows"]] == ["tx-order-3", "tx-order-1"]
    older = web.get("/api/topics/orders", params={"size": 2, "before": topic["committed_messages"]["next_before"]})
    assert [m["transaction_id"] for m in older.json()["committed_messages"]["rows"]] == ["tx-order-0"]
    assert [h["transaction_id"] for h in topic["in_flight_messages"]["rows"]] == ["tx-open"]
    assert web.get("/topics/orders").status_code == 200
    assert web.get("/api/topics/nope").status_code == 404


def test_a_transaction_is_found_by_id_and_by_key(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client)

    def state_of(txid: str) -> list[str]:
        return [m["state"] for m in web.get("/api/transactions", params={"id": txid}).json()["messages"]]

    assert state_of("tx-open") == ["IN_FLIGHT"]
    assert state_of("tx-order-2") == ["ROLLED_BACK"]
    assert state_of("tx-dead") == ["DEAD_LETTERED"]
    committed = web.get("/api/transactions", params={"id": "tx-order-0"}).json()["messages"][0]
    assert committed["state"] == "COMMITTED" and committed["entry_id"] == real_client.xrange("orders")[0][0].decode()
    assert committed["producer_group"] == GROUP and committed["born_ms"]
    dead = web.get("/api/transactions", params={"id": "tx-dead"}).json()["messages"][0]
    assert dead["checks"] >= 1 and dead["reason"]
    by_key = web.get("/api/transactions", params={"key": "order-open"}).json()
    assert [(m["transaction_id"], m["state"]) for m in by_key["messages"]] == [("tx-open", "IN_FLIGHT")]
    page = web.get("/transactions", params={"key": "order-1"})
    assert 'data-transaction="tx-order-1" data-state="COMMITTED"' in page.text
    assert web.get("/transactions", params={"id": "tx-nothing"}).status_code == 404


def test_a_transaction_of_several_messages_shows_its_parts_and_decision(real_client: redis.Redis) -> None:
    broker = RedisBroker(real_client, SETTINGS)
    broker.load_scripts()
    for i, topic in enumerate(["orders", "payments"]):
        broker.prepare_half(TopicKeys(topic), Message(topic, b"part"), f"tx-many.{i}", GROUP, "tx-many")
    broker.decide("tx-many", GROUP, COMMIT, EndSource.PRODUCER)
    broker.end_transaction(TopicKeys("orders"), "tx-many.0", GROUP, COMMIT, source=EndSource.PRODUCER)
    found = console(real_client).get("/api/transactions", params={"id": "tx-many"}).json()
    assert found["several"] and found["decision"]["outcome"] == "COMMIT"
    assert [(m["transaction_id"], m["state"]) for m in found["messages"]] == [
        ("tx-many.0", "COMMITTED"),
        ("tx-many.1", "IN_FLIGHT"),
    ]


def test_a_dead_letter_committed_from_the_console_is_published_once_and_audited(
    real_client: redis.Redis, seeded: dict[str, str]
) -> None:
    web = console(real_client)
    assert 'data-testid="choose"' not in web.get("/dead").text  # not logged in: no action
    log_in(web, "alice")
    page = web.get("/dead").text
    assert 'value="payments tx-dead"' in page
    csrf = csrf_of(page)
    form = {"csrf": csrf, "action": "commit", "tx": ["payments tx-dead"]}
    confirm = web.post("/dead/confirm", data=form)
    assert confirm.status_code == 200 and 'data-testid="confirm-form"' in confirm.text
    assert real_client.xlen("payments") == 0  # nothing done before the confirmation
    done = web.post("/dead/apply", data=form)
    assert done.status_code == 200 and 'data-ok="1"' in done.text, done.text
    again = web.post("/dead/apply", data=form)  # a second submit changes nothing
    assert "already done" in again.text
    assert [f[b"body"] for _, f in real_client.xrange("payments")] == [b"pay"]
    assert real_client.xlen(TopicKeys("payments").dead_stream) == 0
    audit = web.get("/api/audit").json()["rows"]  # newest first: each action's intent, then its outcome
    assert [(r["operator"], r["action"], r["transaction_id"], r["topic"], r["phase"], r["ok"]) for r in audit] == [
        ("alice", "commit", "tx-dead", "payments", "outcome", "1"),
        ("alice", "commit", "tx-dead", "payments", "intent", ""),
        ("alice", "commit", "tx-dead", "payments", "outcome", "1"),
        ("alice", "commit", "tx-dead", "payments", "intent", ""),
    ]
    assert audit[-2]["intent"] == audit[-1]["id"] and audit[-2]["outcome"] == "done"
    assert 'data-transaction="tx-dead" data-action="commit" data-phase="intent"' in web.get("/audit").text


def test_actions_need_the_csrf_token_and_a_login(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client)
    csrf = csrf_of(web.get("/login").text)
    wrong = web.post("/login", data={"csrf": csrf, "operator": "mallory", "token": "not-the-token"})
    assert wrong.status_code == 403 and "wrong operator token" in wrong.text
    form = {"action": "commit", "tx": ["payments tx-dead"]}
    assert web.post("/dead/apply", data={**form, "csrf": csrf}).status_code == 403  # not logged in
    log_in(web)
    assert web.post("/dead/apply", data=form).status_code == 403  # no token
    assert web.post("/dead/apply", data={**form, "csrf": "forged"}).status_code == 403
    assert web.post("/dead/confirm", data={**form, "csrf": csrf}).status_code == 403  # rotated at login
    other = console(real_client)  # another browser: its own session, its own token
    assert other.post("/dead/apply", data={**form, "csrf": csrf_of(web.get("/dead").text)}).status_code == 403
    assert real_client.xlen("payments") == 0 and real_client.xlen(AUDIT_STREAM) == 0


def test_read_only_mode_has_no_forms_and_refuses_posts(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client, token=None)
    for path in ("/", "/dead", "/topics", "/audit", "/jobs"):
        page = web.get(path)
        assert page.status_code == 200, path
        assert '<form method="post"' not in page.text and 'data-testid="read-only"' in page.text, path
    form = {"csrf": "x", "action": "commit", "tx": ["payments tx-dead"], "operator": "a", "token": TOKEN}
    for path in ("/dead/apply", "/dead/confirm", "/login"):
        assert web.post(path, data=form).status_code == 403, path
    assert web.get("/login").status_code == 404
    assert real_client.xlen("payments") == 0


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/topics?size=0", 400, "size must be a whole number between 1 and 500"),
        ("/topics?size=100000", 400, "size must be a whole number between"),
        ("/topics?page=x", 400, "page must be a whole number"),
        ("/topics?sort=evil", 400, "sort must be one of"),
        ("/dead?min_age=soon", 400, "min_age must be a number"),
        ("/dead?topic=bad%20topic", 400, "topic"),
        ("/transactions?id=%3Cscript%3E", 400, "is not a transaction id"),
        ("/transactions?id=tx-unknown", 404, "tx-unknown"),
        ("/topics/nope", 404, "no registered topic"),
        ("/topics/orders?before=yesterday", 400, "stream entry id"),
        ("/no-such-page", 404, "no such page"),
        ("/api/topics?size=-1", 400, "size must be a whole number between"),
        ("/api/transactions", 400, "give ?id="),
    ],
)
def test_bad_input_gets_an_error_page_never_a_traceback(
    real_client: redis.Redis, seeded: dict[str, str], path: str, status: int, says: str
) -> None:
    response = console(real_client).get(path)
    assert response.status_code == status
    assert says in (response.json()["error"] if path.startswith("/api") else response.text)
    assert "Traceback" not in response.text and "<script>" not in response.text


def password_server() -> Iterator[tuple[str, redis.Redis]]:
    server = EmbeddedRedis(prefer_binary=True).start()
    try:
        admin_client = redis.Redis.from_url(server.url)
        admin_client.config_set("requirepass", "pa55-word-never-shown")
        host_port = server.url.split("://", 1)[1].split("/", 1)[0]
        url = f"redis://:pa55-word-never-shown@{host_port}/0"
        yield url, redis.Redis.from_url(url)
    finally:
        server.stop()


@pytest.fixture
def protected() -> Iterator[tuple[str, redis.Redis]]:
    yield from password_server()


def test_no_page_shows_the_password(protected: tuple[str, redis.Redis], caplog: pytest.LogCaptureFixture) -> None:
    url, client = protected
    seed(client)
    web = console(client, redis_url=url)
    log_in(web)
    shown = [web.get(path).text for path in ("/", "/topics", "/topics/orders", "/dead", "/audit", "/jobs", "/api")]
    shown.append(web.get("/api/overview").text)
    assert all("pa55-word-never-shown" not in text for text in shown)
    assert "redis://:***@" in shown[0]
    wrong = redis.Redis.from_url(url.replace("pa55-word-never-shown", "other-pass"))
    broken = console(wrong, redis_url=url.replace("pa55-word-never-shown", "other-pass")).get("/")
    assert broken.status_code == 503 and "other-pass" not in broken.text
    assert "pa55-word-never-shown" not in caplog.text and "other-pass" not in caplog.text


def test_the_console_works_under_the_console_acl_user(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    host = real_client.connection_pool.connection_kwargs
    real_client.execute_command("ACL", "SETUSER", "txmq-console", "on", ">pw-console", *acl_rules("console", topics=[]))
    try:
        reader = redis.Redis(host=host["host"], port=host["port"], username="txmq-console", password="pw-console")
        real_client.xadd(AUDIT_STREAM, {"operator": "bob", "action": "rollback", "transaction_id": "x", "topic": "t"})
        web = console(reader, action_client=real_client)
        for path in ("/api/overview", "/api/topics", "/api/topics/orders", "/api/dead", "/api/audit", "/api/jobs"):
            assert web.get(path).status_code == 200, (path, web.get(path).text)
        for query in ({"id": "tx-open"}, {"id": "tx-order-0"}, {"key": "order-1"}):
            assert web.get("/api/transactions", params=query).status_code == 200, query
        with pytest.raises(redis.ResponseError, match="NOPERM|no permissions"):
            reader.xadd("orders", {"body": b"x"})
        log_in(web)  # the actions run on the operator's client
        form = {"csrf": csrf_of(web.get("/dead").text), "action": "rollback", "tx": ["payments tx-dead"]}
        assert 'data-ok="1"' in web.post("/dead/apply", data=form).text
        named = acl_rules("console", topics=["orders"])
        assert "%R~orders" in named and "%R~*" not in named
    finally:
        real_client.execute_command("ACL", "DELUSER", "txmq-console")


def start_server(binary: str, port: int) -> subprocess.Popen[bytes]:
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_ping(f"redis://127.0.0.1:{port}/0", process=process)
    return process


def test_redis_going_away_shows_a_banner_and_the_page_recovers() -> None:
    found = server_binary()
    if found is None:
        pytest.skip("needs a redis-server binary to stop and start again")
    port = free_port()
    process = start_server(found[0], port)
    client = redis.Redis(port=port, socket_timeout=2)
    try:
        seed(client)
        web = console(client)
        assert web.get("/").status_code == 200
        process.terminate()
        process.wait(10)
        down = web.get("/")
        assert down.status_code == 503 and 'data-testid="error"' in down.text and "Traceback" not in down.text
        assert 'hx-trigger="every' in down.text  # it keeps polling
        live = web.get("/topics", headers={"HX-Request": "true"})
        assert live.status_code == 503 and "<html" not in live.text
        assert web.get("/api/overview").status_code == 503
        process = start_server(found[0], port)
        wait_until(lambda: web.get("/").status_code == 200, timeout=15)
    finally:
        process.terminate()
        process.wait(10)
        client.close()


def test_txmq_console_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from redis_txmq.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an install without the console extra has
    result = CliRunner().invoke(main, ["console", "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 1
    assert "pip install 'redis-txmq[console]'" in result.output and "Traceback" not in result.output


def test_txmq_acl_prints_the_read_only_console_role() -> None:
    from click.testing import CliRunner

    from redis_txmq.cli import main

    every = CliRunner().invoke(main, ["acl", "console"])
    assert every.exit_code == 0 and every.output.startswith("ACL SETUSER txmq-console on >YOUR-PASSWORD resetkeys")
    assert "%R~*" in every.output and "+xadd" not in every.output and "+evalsha" not in every.output
    named = CliRunner().invoke(main, ["acl", "console", "--topic", "orders"])
    assert "%R~orders " in named.output and "%R~* " not in named.output
    refused = CliRunner().invoke(main, ["acl", "producer", "--group", "g"])
    assert refused.exit_code == 1 and "name at least one topic" in refused.output


# what an adversarial review found, each fixed at its cause --------------------------------------------------------


def dead_transaction_of_several(client: redis.Redis, topics: list[str], parent: str = "P") -> None:
    """A transaction of several messages, one on each of ``topics``, its producer gone before deciding: the checker
    dead-letters every message."""
    broker = RedisBroker(client, SETTINGS)
    broker.load_scripts()
    for i, topic in enumerate(topics):
        broker.prepare_half(TopicKeys(topic), Message(topic, f"part {i}".encode()), f"{parent}.{i}", GROUP, parent)
    checker = Checker(client, SETTINGS)

    def dead_lettered() -> bool:
        checker.run_round()
        return all(client.hexists(TopicKeys(t).dead_index, f"{parent}.{i}") for i, t in enumerate(topics))

    wait_until(dead_lettered)


def audit_records(client: redis.Redis) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in client.xrange(AUDIT_STREAM)]


def test_an_action_stopped_part_way_says_what_it_did_and_a_repeat_finishes_it(real_client: redis.Redis) -> None:
    dead_transaction_of_several(real_client, ["alpha", "beta"])
    real_client.set("beta", "not a stream")  # beta's topic key refuses its message: the commit stops after alpha's
    web = console(real_client)
    log_in(web)
    form = {"csrf": csrf_of(web.get("/login").text), "action": "commit", "tx": ["alpha P.0"]}
    confirm = web.post("/dead/confirm", data=form)
    assert re.findall(r'data-transaction="(P\.\d)"', confirm.text) == ["P.0", "P.1"]  # what the commit touches
    done = web.post("/dead/apply", data=form)
    assert [f[b"transaction_id"] for _, f in real_client.xrange("alpha")] == [b"P.0"]  # published
    assert real_client.hexists(TopicKeys("beta").dead_index, "P.1")  # not
    heading = re.search(r'data-testid="applied-heading">([^<]*)<', done.text)
    assert heading and heading.group(1) == "commit: partly done: read each row"
    assert 'data-ok="0" data-outcome="partial"' in done.text
    assert 'data-transaction="P.0" data-state="COMMITTED" data-applied="1"' in done.text
    assert 'data-transaction="P.1" data-state="DEAD_LETTERED" data-applied="0"' in done.text
    assert "holds another type than a stream" in done.text and "Run the same action again to finish" in done.text
    intent, outcome = audit_records(real_client)
    assert (intent["phase"], intent["ids"]) == ("intent", "P.0 on alpha, P.1 on beta")
    assert (outcome["phase"], outcome["ok"], outcome["outcome"]) == ("outcome", "0", "partial")
    assert outcome["applied"].startswith("P.0 on alpha: published as ") and "P.1" not in outcome["applied"]

    real_client.delete("beta")  # repaired: the same action again finishes the job
    again = web.post("/dead/apply", data=form)
    assert 'data-ok="1" data-outcome="done"' in again.text
    assert [f[b"transaction_id"] for _, f in real_client.xrange("beta")] == [b"P.1"]
    assert [f[b"transaction_id"] for _, f in real_client.xrange("alpha")] == [b"P.0"]  # once
    assert audit_records(real_client)[-1]["outcome"] == "done"


def test_nothing_is_done_without_its_audit_record_of_intent(
    real_client: redis.Redis, seeded: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    host = real_client.connection_pool.connection_kwargs
    rules = acl_rules("checker", topics=["orders", "payments"])  # without ~txmq:audit
    real_client.execute_command("ACL", "SETUSER", "op", "reset", "on", ">op-password-123", *rules)
    try:
        operator = redis.Redis(host=host["host"], port=host["port"], username="op", password="op-password-123")
        web = console(real_client, action_client=operator)
        log_in(web)
        form = {"csrf": csrf_of(web.get("/dead").text), "action": "commit", "tx": ["payments tx-dead"]}
        refused = web.post("/dead/apply", data=form)
        assert 'data-ok="0" data-outcome="refused"' in refused.text
        assert "audit record cannot be written" in refused.text and f"~{AUDIT_STREAM}" in refused.text
        assert real_client.xlen("payments") == 0 and not real_client.exists(AUDIT_STREAM)
        assert real_client.hexists(TopicKeys("payments").dead_index, "tx-dead")
    finally:
        real_client.execute_command("ACL", "DELUSER", "op")

    seen: list[list[str]] = []
    resolve = admin.resolve_dead_target

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append([r["phase"] for r in audit_records(real_client)])
        return resolve(*args, **kwargs)

    monkeypatch.setattr(admin, "resolve_dead_target", spy)
    web = console(real_client)
    log_in(web, "bob")
    form = {"csrf": csrf_of(web.get("/dead").text), "action": "rollback", "tx": ["payments tx-dead"]}
    assert 'data-ok="1"' in web.post("/dead/apply", data=form).text
    assert seen == [["intent"]]  # written before the action ran
    intent, outcome = audit_records(real_client)
    assert (intent["operator"], intent["action"], intent["transaction_id"], intent["ids"]) == (
        "bob",
        "rollback",
        "tx-dead",
        "tx-dead on payments",
    )
    assert (outcome["phase"], outcome["outcome"], outcome["intent"]) == (
        "outcome",
        "done",
        real_client.xrange(AUDIT_STREAM)[0][0].decode(),
    )
    page = web.get("/audit").text
    assert 'data-phase="intent"' in page and 'data-phase="outcome" data-outcome="done"' in page


def test_every_message_of_a_large_transaction_of_several_is_looked_up(real_client: redis.Redis) -> None:
    broker = RedisBroker(real_client, SETTINGS)
    broker.load_scripts()
    orders = TopicKeys("orders")
    for i in [*range(70), 450]:
        broker.prepare_half(orders, Message("orders", b"x"), f"big.{i}", GROUP, "big")
    broker.decide("big", GROUP, COMMIT, EndSource.PRODUCER)
    for i in range(64):
        broker.end_transaction(orders, f"big.{i}", GROUP, COMMIT, source=EndSource.PRODUCER)
    web = console(real_client)

    first = web.get("/api/transactions", params={"id": "big"}).json()
    states = [(m["transaction_id"], m["state"]) for m in first["messages"]]
    assert len(states) == 70 and states[64:] == [(f"big.{i}", "IN_FLIGHT") for i in range(64, 70)]
    assert first["parts"] == {
        "page": 1,
        "pages": 5,
        "first": 0,
        "last": 199,
        "per_page": 200,
        "max_transaction_messages": 1000,
        "complete": False,
    }
    page = web.get("/transactions", params={"id": "big"}).text
    assert 'data-complete="0"' in page and 'data-testid="next-parts"' in page
    third = web.get("/api/transactions", params={"id": "big", "parts": 3}).json()
    assert [m["transaction_id"] for m in third["messages"]] == ["big.450"]
    asked = web.get("/api/transactions", params={"id": "big.450"}).json()  # the page holding the message asked for
    assert asked["parts"]["page"] == 3 and [m["transaction_id"] for m in asked["messages"]] == ["big.450"]
    assert web.get("/api/transactions", params={"id": "big", "parts": 6}).status_code == 400

    small = create_app(real_client, Settings(max_transaction_messages=100), operator_token=None, options=FAST)
    whole = TestClient(small, base_url=LOCAL).get("/api/transactions", params={"id": "big"}).json()
    assert whole["parts"]["complete"] and whole["parts"]["last"] == 99  # all a transaction may hold, on one page


def test_a_refused_login_never_logs_what_was_typed(real_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    web = console(real_client)
    csrf = csrf_of(web.get("/login").text)
    with caplog.at_level("INFO"):
        swapped = web.post("/login", data={"csrf": csrf, "operator": TOKEN, "token": "alice"})
        wrong = web.post("/login", data={"csrf": csrf, "operator": "mallory-typed-this", "token": "not-the-token"})
    assert swapped.status_code == 403 and "operator token in the name field" in swapped.text
    assert wrong.status_code == 403
    assert TOKEN not in caplog.text and "mallory-typed-this" not in caplog.text
    assert caplog.text.count("a login from testclient was refused") == 2


def test_logging_out_ends_the_session_for_every_copy_of_its_cookie(
    real_client: redis.Redis, seeded: dict[str, str]
) -> None:
    web = console(real_client)
    log_in(web)
    copied = dict(web.cookies)
    csrf = csrf_of(web.get("/dead").text)
    form = {"csrf": csrf, "action": "recheck", "tx": ["payments tx-dead"]}
    assert web.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    replayed = TestClient(web.app, raise_server_exceptions=False, base_url=LOCAL, cookies=copied)
    refused = replayed.post("/dead/apply", data=form)
    assert refused.status_code == 403 and "log in as an operator first" in refused.text
    assert not real_client.exists(AUDIT_STREAM)

    log_in(web)  # a session lasts SESSION_SECONDS from its login, however often it is used
    sessions = web.app.state.console.sessions
    assert 'data-testid="operator"' in web.get("/dead").text
    started = sessions.clock()
    sessions.clock = lambda: started + 8 * 3600
    assert 'data-testid="operator"' not in web.get("/dead").text


def test_actions_take_whole_ids_only(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    web = console(real_client)
    log_in(web)
    csrf = csrf_of(web.get("/dead").text)
    shortened = {"csrf": csrf, "action": "commit", "tx": ["payments tx-"]}
    confirm = web.post("/dead/confirm", data=shortened)
    assert confirm.status_code == 400 and "not the whole id of a dead letter" in confirm.text
    applied = web.post("/dead/apply", data=shortened)
    assert 'data-ok="0" data-outcome="refused"' in applied.text and "not the whole id" in applied.text
    assert real_client.xlen("payments") == 0 and not real_client.exists(AUDIT_STREAM)
    whole = web.post("/dead/confirm", data={**shortened, "tx": ["payments tx-dead"]})
    assert re.findall(r'data-testid="confirm-id">([^<]*)<', whole.text) == ["tx-dead"]
    assert 'data-ok="1"' in web.post("/dead/apply", data={**shortened, "tx": ["payments tx-dead"]}).text
    assert {r["transaction_id"] for r in audit_records(real_client)} == {"tx-dead"}


def test_wrong_tokens_are_throttled(real_client: redis.Redis) -> None:
    web = console(real_client)
    csrf = csrf_of(web.get("/login").text)
    for i in range(5):
        wrong = web.post("/login", data={"csrf": csrf, "operator": "x", "token": f"guess-{i}"})
        assert wrong.status_code == 403
    throttled = web.post("/login", data={"csrf": csrf, "operator": "alice", "token": TOKEN}, follow_redirects=False)
    assert throttled.status_code == 429 and "wrong operator tokens from your address" in throttled.text
    assert 0 < int(throttled.headers["retry-after"]) <= 60
    throttle = web.app.state.console.throttle
    started = throttle.clock()
    throttle.clock = lambda: started + 60
    log_in(web)  # the window passed

    from redis_txmq.ops.console.app import LoginThrottle

    clock = [0.0]
    overall = LoginThrottle(per_client=5, overall=20, window=60, clock=lambda: clock[0])
    for i in range(20):
        assert overall.wait(f"10.0.0.{i}")[0] == 0
        overall.failed(f"10.0.0.{i}")
    assert overall.wait("10.0.0.99")[0] == 60  # many addresses, one bound
    clock[0] = 60
    assert overall.wait("10.0.0.99")[0] == 0


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/jobs", {"page": str(10**30)}),
        ("/api/jobs", {"page": "99999999999999999"}),
        ("/api/topics", {"page": str(10**30)}),
        ("/api/topics", {"page": "1" * 5000}),
        ("/api/topics", {"size": "1_0"}),
        ("/api/topics", {"size": " 5"}),
        ("/api/topics/orders", {"partition": "²"}),
        ("/api/topics/orders", {"partition": "١"}),
        ("/api/topics/orders", {"partition": "9" * 5000}),
        ("/api/topics/orders", {"partition": "1"}),  # orders has one partition: 0
        ("/api/topics/orders", {"before": "99999999999999999999-99999999999999999999"}),
        ("/api/topics/orders", {"after": "18446744073709551616-0"}),
        ("/api/topics/orders", {"before": "١-0"}),
        ("/api/audit", {"before": "99999999999999999999-0"}),
        ("/api/dead", {"min_age": "1e308"}),
        ("/api/dead", {"min_age": "-0"}),
        ("/api/dead", {"min_age": "nan"}),
        ("/api/transactions", {"id": "big.١"}),
        ("/api/transactions", {"id": "tx-dead", "parts": "0"}),
    ],
)
def test_bad_input_is_a_short_400_never_a_500_nor_a_503(
    real_client: redis.Redis, seeded: dict[str, str], path: str, params: dict[str, str]
) -> None:
    response = console(real_client, token=None).get(path, params=params)
    assert response.status_code == 400, response.text
    assert len(response.json()["error"]) < 200  # never the whole input back


def test_the_edges_of_the_stream_id_range_are_pages_with_nothing_on_them(
    real_client: redis.Redis, seeded: dict[str, str]
) -> None:
    web = console(real_client, token=None)
    top = "18446744073709551615-18446744073709551615"
    oldest = web.get("/api/topics/orders", params={"before": "0-0", "after": top}).json()
    assert oldest["committed_messages"]["rows"] == [] and oldest["in_flight_messages"]["rows"] == []
    assert web.get("/api/audit", params={"before": "0-0"}).json()["rows"] == []
    assert len(web.get("/api/topics/orders", params={"before": top}).json()["committed_messages"]["rows"]) == 3


def test_only_requests_naming_the_console_are_served(real_client: redis.Redis, seeded: dict[str, str]) -> None:
    app = create_app(real_client, SETTINGS, operator_token=TOKEN, options=FAST, allowed_hosts=["console.example"])
    web = TestClient(app, raise_server_exceptions=False, base_url=LOCAL)
    for host in ("attacker.example", "attacker.example:8640", "console.example.attacker.example"):
        assert web.get("/api/topics/orders", headers={"Host": host}).status_code == 400, host
    for host in ("127.0.0.1:8640", "localhost", "[::1]:8640", "console.example"):
        assert web.get("/api/topics/orders", headers={"Host": host}).status_code == 200, host
    with pytest.raises(TxMQError, match="allowed host"):
        create_app(real_client, SETTINGS, operator_token=None, allowed_hosts=["a*b"])

    csrf = csrf_of(web.get("/login").text)
    large = web.post("/login", data={"csrf": csrf, "operator": "x" * 2_000_000, "token": TOKEN})
    assert large.status_code == 413

    def chunks() -> Iterator[bytes]:
        yield f"csrf={csrf}&operator=".encode()
        for _ in range(20):
            yield b"x" * 100_000

    headers = {"content-type": "application/x-www-form-urlencoded"}
    assert web.post("/login", content=chunks(), headers=headers).status_code == 413


def test_an_invalid_operator_redis_url_is_named_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from redis_txmq.cli import main

    monkeypatch.setenv("TXMQ_CONSOLE_OPERATOR_REDIS_URL", "htp://op:secret-pw-9@127.0.0.1:1/0")
    result = CliRunner().invoke(main, ["console", "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 1, result.output
    assert "TXMQ_CONSOLE_OPERATOR_REDIS_URL" in result.output and "secret-pw-9" not in result.output


def test_a_password_in_the_query_of_a_redis_url_is_starred_out_of_errors() -> None:
    from redis_txmq.core.clients import scrub, url_secrets

    url = "redis://op@127.0.0.1:6390/0?password=Hunter2-SecretPw&db=0"
    hidden = url_secrets(url)
    assert "Hunter2-SecretPw" in hidden
    assert scrub(f"cannot reach {url}; Hunter2-SecretPw refused", hidden) == (
        "cannot reach redis://op@127.0.0.1:6390/0?password=***&db=0; *** refused"
    )


def test_a_message_ended_by_someone_else_meanwhile_is_not_counted_as_the_failed_actions(
    real_client: redis.Redis, seeded: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve = admin.resolve_dead_target

    def raced(broker: Any, target: Any, action: Any, remark: str = "") -> Any:
        resolve(broker, target, type(action).COMMIT, "another operator")  # commits it first
        return resolve(broker, target, action, remark)  # the rollback asked for then conflicts

    monkeypatch.setattr(admin, "resolve_dead_target", raced)
    web = console(real_client)
    log_in(web)
    form = {"csrf": csrf_of(web.get("/dead").text), "action": "rollback", "tx": ["payments tx-dead"]}
    refused = web.post("/dead/apply", data=form)
    assert 'data-ok="0" data-outcome="refused"' in refused.text
    assert 'data-transaction="tx-dead" data-state="COMMITTED" data-applied="0"' in refused.text
    outcome = audit_records(real_client)[-1]
    assert (outcome["outcome"], outcome["applied"]) == ("refused", "")


def test_a_topic_whose_partition_count_was_lost_still_shows_its_partitions(real_client: redis.Redis) -> None:
    """The topic's page reads its partitions from the topic's record and asks the registry which are listed; with
    the record gone (Redis lost it: ``topics.restore_partitions_call``'s case) the registry alone tells them."""
    from redis_txmq.core.keys import topic_meta_key
    from redis_txmq.core.topics import create_topic, partition_keys_of

    create_topic(real_client, "invoices", 12)  # more than ten: the partitions in number order, not as text
    broker = RedisBroker(real_client, SETTINGS)
    broker.load_scripts()
    for keys in partition_keys_of("invoices", 12)[:3]:
        broker.prepare_half(keys, Message("invoices", b"{}"), f"tx-{keys.partition}", GROUP)
    web = console(real_client)
    shown = web.get("/api/topics/invoices").json()
    assert [p["partition"] for p in shown["partitions"]] == list(range(12))
    real_client.delete(topic_meta_key("invoices"))
    lost = web.get("/api/topics/invoices")
    assert lost.status_code == 200, lost.text
    figures = [(p["partition"], p["in_flight"]) for p in lost.json()["partitions"]]
    assert figures == [(0, 1), (1, 1), (2, 1)] + [(i, 0) for i in range(3, 12)]
