"""The web console in a real browser: Debian's Chromium driven by Playwright, against ``txmq console`` run as its own
server process on a test Redis. What a person relies on: the overview's numbers are ``txmq status --json``'s; a
transaction found by its key changes on the page, without a reload, when its producer commits; a dead letter
committed from the page is published once and audited; a read-only console has no action and refuses a forged POST;
a page open while Redis goes away shows the error and comes back by itself.

Needs ``playwright`` (the dev extra) and ``/usr/bin/chromium`` (Debian's ``chromium``, installed by
``scripts/setup``; Playwright's own browser builds are never downloaded). Without them the module is skipped, but
fails under ``CI=true``. ``TXMQ_CONSOLE_SCREENSHOTS=<dir>`` makes the tests save a screenshot of each page there
(``docs/images/console`` holds the ones the guide shows); a normal run writes none."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

CHROMIUM = Path("/usr/bin/chromium")


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (the dev extra has it: pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return f"Debian's chromium is not installed ({CHROMIUM}; bash scripts/setup installs it)"
    return None


if _missing():
    if os.environ.get("CI") == "true":  # CI has both (scripts/setup): there, a missing one fails instead of skipping
        pytest.fail(f"the browser tests cannot run: {_missing()}", pytrace=False)
    pytest.skip(str(_missing()), allow_module_level=True)

pytest.importorskip("starlette")  # the console extra, as tests/test_console.py

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

from redis_txmq import LocalTransactionState, Message, TransactionListener, TransactionProducer  # noqa: E402
from redis_txmq.checker import Checker  # noqa: E402
from redis_txmq.core.keys import AUDIT_STREAM, TopicKeys  # noqa: E402
from redis_txmq.core.topics import create_topic  # noqa: E402
from redis_txmq.jobs import COMMIT as JOB_COMMIT  # noqa: E402
from redis_txmq.jobs import UnpublishableJobError, WriteJob  # noqa: E402
from redis_txmq.sync.broker import EndSource, RedisBroker  # noqa: E402
from redis_txmq.transport.embedded import free_port, server_binary, wait_for_ping  # noqa: E402

from .helpers import wait_until  # noqa: E402
from .test_console import GROUP, SETTINGS, TOKEN, seed  # noqa: E402
from .test_jobs import stage_rows  # noqa: E402

pytestmark = [pytest.mark.real, pytest.mark.slow]

TXMQ = str(Path(sys.executable).parent / "txmq")
TOKEN_ENV = "TXMQ_CONSOLE_OPERATOR_TOKEN"
SCREENSHOTS = os.environ.get("TXMQ_CONSOLE_SCREENSHOTS")
VIEWPORT = {"width": 1280, "height": 800}
CHANGE_SECONDS = 20
"""How long a page may take to show a change: htmx polls every 2 s and the status snapshot is at most 2 s old; the
rest is room for a loaded machine."""


# the console as a server, the browser --------------------------------------------------------------------------------


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def console_server(redis_url: str, tmp_path: Path, token: str | None = None) -> Iterator[str]:
    """``txmq console`` on a free port of 127.0.0.1 in a process of its own, configured by its environment as an
    operator would (``TXMQ_REDIS_URL``, ``TXMQ_CONSOLE_OPERATOR_TOKEN``); yields its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_CONSOLE_")}
    env["TXMQ_REDIS_URL"] = redis_url
    if token:
        env[TOKEN_ENV] = token
    log = tmp_path / f"console-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([TXMQ, "console", "--port", str(port)], env=env, stdout=out, stderr=out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or _answers(f"{base}/api"), timeout=60, interval=0.1)
        assert process.poll() is None, f"txmq console exited: {log.read_text()}"
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(CHANGE_SECONDS * 1000)
    tab = context.new_page()
    yield tab
    context.close()


def screenshot(page: Page, name: str) -> None:
    """The page as a person sees it, into ``$TXMQ_CONSOLE_SCREENSHOTS/<name>.png``; nothing when it is not set."""
    if not SCREENSHOTS:
        return
    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    page.evaluate("document.fonts.ready")
    page.screenshot(path=str(folder / f"{name}.png"))


def text_of(page: Page, testid: str) -> str:
    return page.get_by_test_id(testid).inner_text().strip()


def mark_document(page: Page) -> Callable[[], bool]:
    """A flag on the page's window: still there later means the page was updated in place, not reloaded."""
    page.evaluate("window.txmqNotReloaded = true")
    return lambda: page.evaluate("window.txmqNotReloaded === true")


def txmq_status(redis_url: str) -> dict[str, Any]:
    run = subprocess.run(
        [TXMQ, "status", "--json", "--redis-url", redis_url], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout)


# data ----------------------------------------------------------------------------------------------------------------


def dead_letters(client: redis.Redis, topic: str, reasons: dict[str, bytes]) -> None:
    """Transactions whose producer never answers, dead-lettered by the checker (check_max 1)."""
    broker = RedisBroker(client, SETTINGS)
    broker.load_scripts()
    keys = TopicKeys(topic)
    for i, (txid, body) in enumerate(reasons.items()):
        broker.prepare_half(keys, Message(topic, body, keys=f"refund-{i}"), txid, GROUP)
    checker = Checker(client, SETTINGS)

    def all_dead() -> bool:
        checker.run_round()
        return all(client.hexists(keys.dead_index, txid) for txid in reasons)

    wait_until(all_dead, timeout=30)


def write_jobs(client: redis.Redis) -> None:
    """Two write jobs of the Spark writer: one leased (its driver is writing), one parked for an operator (a stage
    lost after its decision)."""
    running = WriteJob.micro_batch(client, "orders-sink", 42)
    running.register()
    parked = WriteJob.new(client, SETTINGS)
    kept, lost = (
        stage_rows(client, parked, "orders-archive", "p0", 3),
        stage_rows(client, parked, "orders-archive", "p1", 3),
    )
    decision = parked.decide(JOB_COMMIT, {kept: 3, lost: 3})
    client.delete(lost)  # lost in a failover
    with pytest.raises(UnpublishableJobError):
        parked.settle(decision)


def partitioned_topic(client: redis.Redis, topic: str, partitions: int, commits: int) -> None:
    """A topic of ``partitions`` partitions with ``commits`` committed transactions spread over them."""
    create_topic(client, topic, partitions)
    broker = RedisBroker(client, SETTINGS)
    broker.load_scripts()
    for i in range(commits):
        keys, txid = TopicKeys(topic, i % partitions, True), f"tx-{topic}-{i}"
        broker.prepare_half(keys, Message(topic, b'{"amount": 42}', keys=f"{topic}-{i}"), txid, GROUP)
        broker.end_transaction(keys, txid, GROUP, LocalTransactionState.COMMIT, source=EndSource.PRODUCER)


class WaitingListener(TransactionListener):
    """A local transaction that runs until the test lets it commit (a database transaction still open)."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.finish = threading.Event()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        self.running.set()
        assert self.finish.wait(120), "the test never let the local transaction finish"
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


# the tests -----------------------------------------------------------------------------------------------------------


def test_the_overview_and_topics_show_the_numbers_of_txmq_status(
    page: Page, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    seed(real_client)
    partitioned_topic(real_client, "invoices", 3, 7)
    report = txmq_status(redis_url)
    topics = report["topics"]
    per_topic: dict[str, list[int]] = {}  # a partitioned topic is one row: its partitions' figures added up
    for t in topics:
        row = per_topic.setdefault(t["topic"], [0, 0, 0, 0])
        for i, figure in enumerate((1, t["committed"], t["in_flight"], t["dead_letters"])):
            row[i] += figure
    assert per_topic["invoices"] == [3, 7, 0, 0]
    with console_server(redis_url, tmp_path) as base:
        page.goto(base + "/")
        assert text_of(page, "total-topics") == str(len(per_topic))
        assert text_of(page, "total-committed") == str(sum(t["committed"] for t in topics))
        assert text_of(page, "total-in-flight") == str(sum(t["in_flight"] for t in topics))
        assert text_of(page, "total-dead-letters") == str(sum(t["dead_letters"] for t in topics))
        assert text_of(page, "live-checkers") == str(report["checkers"]["live_instances"])
        for group in report["producer_groups"]:
            row = page.locator(f'[data-testid="producer-group-row"][data-group="{group["producer_group"]}"]')
            assert row.get_by_test_id("pending-checks").inner_text() == str(group["pending_check_requests"])
            assert row.get_by_test_id("live-instances").inner_text() == str(group["live_instances"])
        assert page.get_by_test_id("attention-dead").get_attribute("data-count") == "1"
        screenshot(page, "overview")

        page.get_by_test_id("nav-topics").click()
        expect(page.get_by_test_id("topic-row")).to_have_count(len(per_topic))
        for name, figures in per_topic.items():
            row = page.locator(f'[data-testid="topic-row"][data-topic="{name}"]')
            columns = ("partitions", "committed", "in-flight", "dead-letters")
            assert [row.get_by_test_id(column).inner_text() for column in columns] == [str(f) for f in figures], name
        screenshot(page, "topics")

        page.locator('[data-testid="topic-row"][data-topic="orders"] a').first.click()
        expect(page.get_by_test_id("topic-name")).to_have_text("orders")
        messages = page.get_by_test_id("message-row")
        expect(messages).to_have_count(3)  # the committed orders, newest first, with their keys
        assert messages.get_by_test_id("keys").all_inner_texts() == ["order-3", "order-1", "order-0"]
        expect(page.get_by_test_id("half-row").get_by_test_id("keys")).to_have_text("order-open")  # tx-open
        expect(page.locator('[data-testid="consumer-group-row"][data-group="billing"]')).to_have_count(1)
        screenshot(page, "topic")


def test_a_transaction_found_by_its_key_turns_committed_without_a_reload(
    page: Page, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    seed(real_client)
    listener = WaitingListener()
    producer = TransactionProducer(GROUP, listener, client=real_client, settings=SETTINGS).start()
    sent: list[Any] = []
    sender = threading.Thread(
        target=lambda: sent.append(
            producer.send_message_in_transaction(Message("orders", b'{"order": 77}', keys="order-77"))
        ),
        daemon=True,
    )
    try:
        sender.start()
        assert listener.running.wait(30), "the local transaction did not start"
        with console_server(redis_url, tmp_path) as base:
            page.goto(base + "/transactions")
            page.get_by_test_id("search-key").fill("order-77")
            page.get_by_role("button", name="find").click()
            rows = page.get_by_test_id("transaction-row")
            expect(rows).to_have_count(1)
            expect(rows).to_have_attribute("data-state", "IN_FLIGHT")
            not_reloaded = mark_document(page)

            listener.finish.set()  # the local transaction commits: the producer ends the transaction
            sender.join(30)
            (result,) = sent
            assert result.committed_id
            expect(rows).to_have_attribute("data-state", "COMMITTED", timeout=CHANGE_SECONDS * 1000)
            expect(rows).to_have_count(1)
            assert rows.get_by_test_id("entry-id").inner_text() == result.committed_id
            assert rows.get_by_test_id("keys").inner_text() == "order-77"
            assert not_reloaded(), "the page was reloaded: the live region should have changed in place"
            screenshot(page, "transaction")
    finally:
        listener.finish.set()
        producer.shutdown()


def test_a_dead_letter_committed_from_the_console_is_published_once_and_audited(
    page: Page, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    dead_letters(real_client, "refunds", {"tx-refund-1": b'{"refund": 1}', "tx-refund-2": b'{"refund": 2}'})
    seed(real_client)  # tx-dead on payments
    with console_server(redis_url, tmp_path, token=TOKEN) as base:
        page.goto(base + "/dead")
        expect(page.get_by_test_id("dead-row")).to_have_count(3)
        expect(page.get_by_test_id("choose")).to_have_count(0)  # not logged in: no action
        page.get_by_test_id("login-link").click()
        page.get_by_test_id("login-name").fill("alice")
        page.get_by_test_id("login-token").fill(TOKEN)
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_test_id("operator")).to_have_text("alice")

        chosen = page.locator('[data-testid="dead-row"][data-transaction="tx-dead"]').get_by_test_id("choose")
        chosen.check()
        page.evaluate(
            "window.txmqPolls = 0;document.addEventListener('htmx:beforeRequest', () => { window.txmqPolls += 1; })"
        )
        # a poll comes round while a box is ticked (polled from here: the page's CSP refuses wait_for_function's eval)
        wait_until(lambda: page.evaluate("window.txmqPolls >= 1"), timeout=CHANGE_SECONDS, interval=0.2)
        expect(chosen).to_be_checked()  # and the choice survives it
        screenshot(page, "dead")
        page.get_by_test_id("action-commit").click()
        expect(page.get_by_test_id("confirm-items")).to_contain_text("tx-dead")
        assert real_client.xlen("payments") == 0, "nothing is done before the confirmation"
        page.locator('input[name="remark"]').fill("paid at the bank")
        screenshot(page, "dead-confirm")
        page.get_by_test_id("confirm").click()
        expect(page.get_by_test_id("applied-row")).to_have_attribute("data-ok", "1")

        published = [f for _, f in real_client.xrange("payments") if f[b"transaction_id"] == b"tx-dead"]
        assert len(published) == 1 and published[0][b"body"] == b"pay"
        assert real_client.xlen(TopicKeys("refunds").dead_stream) == 2, "only the chosen dead letter is resolved"
        page.get_by_test_id("nav-dead").click()
        expect(page.get_by_test_id("dead-row")).to_have_count(2)

        page.get_by_test_id("nav-audit").click()
        rows = page.get_by_test_id("audit-row")
        expect(rows).to_have_count(2)  # what was about to be done, then what was done
        for row, phase in ((rows.nth(0), "outcome"), (rows.nth(1), "intent")):
            expect(row).to_have_attribute("data-phase", phase)
            expect(row).to_have_attribute("data-transaction", "tx-dead")
            expect(row).to_have_attribute("data-action", "commit")
            expect(row).to_contain_text("alice")
        expect(rows.nth(0)).to_have_attribute("data-outcome", "done")
        screenshot(page, "audit")
    assert [e for _, e in real_client.xrange("payments") if e[b"transaction_id"] == b"tx-dead"] == published


def test_read_only_has_no_actions_and_refuses_a_forged_post(
    page: Page, real_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    seed(real_client)
    write_jobs(real_client)
    with console_server(redis_url, tmp_path) as base:
        for path in ("/", "/topics", "/topics/orders", "/transactions?id=tx-open", "/dead", "/jobs", "/audit"):
            page.goto(base + path)
            expect(page.get_by_test_id("read-only")).to_be_visible()
            for absent in ("choose", "action-commit", "action-rollback", "action-recheck", "login-link", "logout"):
                expect(page.get_by_test_id(absent)).to_have_count(0)
            expect(page.locator('form[method="post"]')).to_have_count(0)
        expect(page.get_by_test_id("nav-jobs")).to_be_visible()
        page.get_by_test_id("nav-jobs").click()
        states = page.get_by_test_id("job-row")
        expect(states).to_have_count(2)
        assert sorted(states.evaluate_all("rows => rows.map(r => r.dataset.state)")) == ["LEASED", "PARKED"]
        screenshot(page, "jobs")

        page.get_by_test_id("nav-dead").click()
        forged = page.evaluate(
            """async () => {
                const form = new URLSearchParams({csrf: "guessed", action: "commit", tx: "payments tx-dead",
                                                  operator: "mallory", token: "guessed-token"});
                const answers = [];
                for (const path of ["/dead/apply", "/dead/confirm", "/login"]) {
                    const response = await fetch(path, {method: "POST", body: form});
                    answers.push(response.status);
                }
                return answers;
            }"""
        )
        assert forged == [403, 403, 403]
        assert page.request.get(base + "/login").status == 404
    assert real_client.xlen("payments") == 0 and real_client.xlen(AUDIT_STREAM) == 0
    assert real_client.hexists(TopicKeys("payments").dead_index, "tx-dead")


def _redis_server(binary: str, port: int, folder: Path) -> subprocess.Popen[bytes]:
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(folder), "--dbfilename", "dump.rdb"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_ping(f"redis://127.0.0.1:{port}/0", process=process)
    return process


def test_a_page_shows_redis_going_away_and_recovers_by_itself(page: Page, tmp_path: Path) -> None:
    found = server_binary()
    if found is None:
        pytest.skip("needs a redis-server binary to stop and start again")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _redis_server(found[0], port, tmp_path)  # this test's own server: the shared one is never stopped
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        seed(client)
        client.save()  # the restarted server loads it: the page must come back with the same figures
        with console_server(url, tmp_path) as base:
            page.goto(base + "/")
            committed = text_of(page, "total-committed")
            assert committed == "3"
            not_reloaded = mark_document(page)

            server.terminate()
            server.wait(10)
            banner = page.get_by_test_id("error")
            expect(banner).to_be_visible(timeout=CHANGE_SECONDS * 1000)
            expect(banner).to_have_attribute("data-status", "503")
            expect(banner).to_contain_text("the page retries by itself")
            expect(page.get_by_test_id("total-committed")).to_have_count(0)
            assert "Traceback" not in page.content()

            server = _redis_server(found[0], port, tmp_path)
            expect(page.get_by_test_id("total-committed")).to_have_text(committed, timeout=CHANGE_SECONDS * 1000)
            expect(banner).to_have_count(0)
            assert not_reloaded(), "the page recovered by reloading: the live region should have come back in place"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def test_a_page_opened_while_the_figures_are_read_says_so_then_shows_them(
    page: Page, real_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At thousands of topic streams the first read takes longer than a page waits (``page_wait_seconds``): the
    page says the figures are being read and, once they are, reloads itself into the page with them."""
    import uvicorn

    from redis_txmq import Settings
    from redis_txmq.ops.console.app import create_app
    from redis_txmq.ops.console.queries import ConsoleOptions

    from .test_console_cost import Gate, register

    gate = Gate(monkeypatch)  # the read of every topic held until the test lets it go
    register(real_client, 5)
    gate.open.clear()
    options = ConsoleOptions(aside_from_streams=5, page_wait_seconds=0.05)
    app = create_app(real_client, Settings(), operator_token=None, options=options)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=30)
        assert gate.entered.wait(10), "the console began its first read when it started"
        page.goto(f"http://127.0.0.1:{port}/topics?sort=topic&order=desc")
        expect(page.get_by_test_id("reading")).to_contain_text("reading the figures of 5 topic streams")
        expect(page.get_by_test_id("topic-row")).to_have_count(0)
        gate.open.set()
        expect(page.get_by_test_id("topic-row")).to_have_count(5)
        assert page.get_by_test_id("topic-row").first.get_attribute("data-topic") == "topic-0004"
        expect(page.get_by_test_id("topics-filter")).to_be_visible()  # the whole page: its filters too
        expect(page.get_by_test_id("reading")).to_have_count(0)
    finally:
        server.should_exit = True
        thread.join(10)
