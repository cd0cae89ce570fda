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


def console(client: Any, token: str | None = TOKEN, **kwargs: Any) -> TestClient:
    app = create_app(client, SETTINGS, operator_token=token, options=kwargs.pop("options", FAST), **kwargs)
    return TestClient(app, raise_server_exceptions=False)


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
    audit = web.get("/api/audit").json()["rows"]
    assert [(r["operator"], r["action"], r["transaction_id"], r["topic"]) for r in audit][-1] == (
        "alice",
        "commit",
        "tx-dead",
        "payments",
    )
    assert real_client.xlen(AUDIT_STREAM) == 2
    assert 'data-transaction="tx-dead" data-action="commit"' in web.get("/audit").text


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
        ("/topics?size=0", 400, "size must be between 1 and 500"),
        ("/topics?size=100000", 400, "size must be between"),
        ("/topics?page=x", 400, "whole numbers"),
        ("/topics?sort=evil", 400, "sort must be one of"),
        ("/dead?min_age=soon", 400, "min_age must be a number"),
        ("/dead?topic=bad%20topic", 400, "topic"),
        ("/transactions?id=%3Cscript%3E", 400, "is not a transaction id"),
        ("/transactions?id=tx-unknown", 404, "tx-unknown"),
        ("/topics/nope", 404, "no registered topic"),
        ("/topics/orders?before=yesterday", 400, "stream entry id"),
        ("/no-such-page", 404, "no such page"),
        ("/api/topics?size=-1", 400, "size must be between"),
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
    wait_for_ping(f"redis://127.0.0.1:{port}/0")
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
