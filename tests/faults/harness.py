"""The system under test, assembled: a redis-server, the fault proxy in front of it, and the service processes
(producers of one group, checkers, consumers of one consumer group), all of which reach Redis through the proxy.

The services keep their orders in SQLite ledgers, one per producer slot, or, given a ``database_url`` (the PostgreSQL
variant), in PostgreSQL: the order service's orders and transaction log, the consumer group's invoices and inbox
(:mod:`.pg_databases`). The journal of sends is a slot's SQLite ledger in both.

``replicated`` (the replica variant): the redis-server has a replica of its own, and every producer and checker
writes at durability ``replica`` (:data:`DURABILITY`), so that the fault ``replica_stall`` (a SIGSTOPped replica)
makes their prepares, decisions and ends fall short of their confirmation.

``clustered`` (the cluster variant): a Redis Cluster of :data:`MASTERS` masters instead of the redis-server, each
behind a proxy of its own, the topics spread over them (:data:`CLUSTER_TOPICS`), every service a cluster client; the
fault ``master_down`` takes down the master that holds none of the keys every part shares (:data:`SHARED_KEYS`)
for a while (:meth:`System.master_down`)."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from redis_txmq import create_topic
from redis_txmq.core.keys import (
    CHECKER_INSTANCES,
    CHECKER_LEVELS,
    GROUP_REGISTRY,
    JOB_REGISTRY,
    REPLY_STREAM,
    TOPIC_REGISTRY,
    GroupKeys,
    TopicKeys,
)
from redis_txmq.core.topics import partition_keys_of

from .ledger import Ledger
from .producer_worker import kill_flag
from .proxy import FaultProxy, ProxyGroup
from .redis_server import FaultCluster, RedisServer, ReplicaServer, cluster_port

ROOT = Path(__file__).resolve().parents[2]
TXMQ = str(Path(sys.executable).parent / "txmq")
PRODUCER_GROUP = "fault_orders"
CONSUMER_GROUP = "billing"
TOPICS = {"orders": 1, "payments": 2}
"""Topic -> partitions: one plain topic, one partitioned."""
SETTINGS = {"transaction_timeout": 1.0, "check_interval": 1.0, "check_max": 100, "claim_idle": 2.0}
HEARTBEAT_INTERVAL = 0.5
DURABILITY = {"durability": "replica", "durability_replicas": 1, "durability_timeout": 0.3}
"""The replica variant's level, for the producers and the checkers: a write the replica has not acknowledged within
0.3 s is a shortfall (a prepare raises PrepareError, an end is the send's end error, a decision or the mark of a
failed send raises DurabilityError), although the master applied it."""
REPLICA_SHARE = 0.6
"""The replica variant sends this share of the orders of the other variants (CI time)."""
REPLICA_MIX = {"many_share": 0.4, "handle_many_share": 0.75}
"""The replica variant's orders: twice the share of orders of several messages, most of them sent with ``tx.send``
(whose shortfalls the services retry), so that every stall catches some of them mid-way."""
MASTERS = 3
"""The cluster variant's masters (no replicas)."""
CLUSTER_TOPICS = {"orders": 3, "payments": 3}
"""The cluster variant's topics: three partitions each, which land one on each master (checked at start)."""
CLUSTER_SHARE = 0.6
"""The cluster variant sends this share of the orders of the other variants (CI time)."""
SHARED_KEYS = (
    REPLY_STREAM,
    CHECKER_INSTANCES,
    CHECKER_LEVELS,
    TOPIC_REGISTRY,
    GROUP_REGISTRY,
    JOB_REGISTRY,
    GroupKeys(PRODUCER_GROUP).check_requests,
    GroupKeys(PRODUCER_GROUP).producers,
    GroupKeys(PRODUCER_GROUP).durability_levels,
)
"""Keys every part of the system uses, whatever the topic: none of them is on the master that ``master_down`` takes
down (a master holding them is only SIGKILLed briefly, by the fault ``redis``)."""
CONSUMER = {"min_idle_time": 2.0}
ASYNC_SLOT = 1
"""The producer slot served by the asyncio producer (:mod:`.async_producer_worker`); the last slot is one-way."""
CONSUMER_LOOPS = ("poll_and_ack", "run", "asyncio")
"""How consumer ``i`` reads: ``CONSUMER_LOOPS[i % 3]`` (see :mod:`.consumer_worker`)."""


def producer_module(slot: int) -> str:
    return "tests.faults.async_producer_worker" if slot == ASYNC_SLOT else "tests.faults.producer_worker"


@dataclass
class Sizes:
    transactions: int = 1000
    rate: float = 25.0
    """Transactions per second, all producers together."""
    producers: int = 3
    checkers: int = 2
    consumers: int = 3


def replica_sizes(sizes: Sizes) -> Sizes:
    """The replica variant's sizes: :data:`REPLICA_SHARE` of the transactions, at the same rate."""
    return dataclasses.replace(sizes, transactions=max(1, math.ceil(sizes.transactions * REPLICA_SHARE)))


def cluster_sizes(sizes: Sizes) -> Sizes:
    """The cluster variant's sizes: :data:`CLUSTER_SHARE` of the transactions, at the same rate."""
    return dataclasses.replace(sizes, transactions=max(1, math.ceil(sizes.transactions * CLUSTER_SHARE)))


def sizes_from_env() -> Sizes:
    """``TXMQ_FAULT_TRANSACTIONS`` (default 1000) and ``TXMQ_FAULT_RATE`` (transactions per second, default 25)."""
    defaults = Sizes()
    return Sizes(
        transactions=int(os.environ.get("TXMQ_FAULT_TRANSACTIONS") or defaults.transactions),
        rate=float(os.environ.get("TXMQ_FAULT_RATE") or defaults.rate),
    )


class Worker:
    """A subprocess that faults may SIGKILL; its output goes to one log file across restarts."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env or {}
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
        env |= {"PYTHONPATH": str(ROOT), "TXMQ_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL), "COLUMNS": "200"}
        env |= self.env
        with self.log.open("ab") as out:
            out.write(f"=== start {self.starts}\n".encode())
            out.flush()
            self._process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    def kill(self) -> None:
        """SIGKILL (a process that had already exited is just reaped)."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGKILL)
            self._process.wait(10)
            self._process = None

    def terminate(self) -> None:
        """SIGTERM: a graceful stop (:meth:`kill` reaps it)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def wait(self, timeout: float) -> None:
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    def exited(self) -> int | None:
        """The exit status if it ended without being killed by the harness, else None."""
        return None if self._process is None else self._process.poll()

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Exit:
    """A worker that ended on its own, with the last line of its log (an exception, usually)."""

    worker: str
    status: int
    last_line: str


@dataclass
class Progress:
    """What the system had done at a moment, on the partitions of the masters that stay up: topic stream entries,
    ends by who applied them (op stream records), deliveries the consumers recorded; and the sends each producer
    slot has finished (journaled with an outcome)."""

    entries: set[tuple[str, str]]
    ends: collections.Counter[str]
    deliveries: int
    sends: list[int]


CATCH_UP_SECONDS = 20.0
"""How long ``master_down`` keeps the master down after its time, at most, until the consumers have received every
entry of the other masters' partitions."""


@dataclass
class Outage:
    """One ``master_down``: how long the master was down, and what the rest did meanwhile."""

    seconds: float
    sending: list[bool]
    """Producer slots that were sending when it went down: some sends done, not all (a first fault may come while
    the services start)."""
    entries: int
    ends: collections.Counter[str]
    deliveries: int
    sends: list[int]
    behind: int
    """Entries of the other masters' partitions (committed before the end of :attr:`seconds`) that the consumers
    had not received :data:`CATCH_UP_SECONDS` later, the master still down."""
    caught_up: float
    """How long after :attr:`seconds` the consumers had them all (or gave up waiting)."""

    def describe(self) -> str:
        busy = ", ".join(f"#{slot} {n}" for slot, n in enumerate(self.sends) if self.sending[slot]) or "none sending"
        ends = ", ".join(f"{count} by {source}" for source, count in sorted(self.ends.items())) or "none"
        waited = (
            f"{self.behind} still not received after {self.caught_up:.1f} s more"
            if self.behind
            else f"all received {self.caught_up:.1f} s after"
        )
        return (
            f"down {self.seconds:.1f} s, on the other masters' partitions: {self.entries} entries, ends {ends}, "
            f"{self.deliveries} deliveries ({waited}); sends finished by producer: {busy}"
        )


@dataclass
class System:
    """Start with :meth:`start`, always :meth:`stop`. Services use :attr:`proxy`; :meth:`client` is direct."""

    workdir: Path
    seed: int
    sizes: Sizes
    database_url: str | None = None
    """The PostgreSQL database (an empty schema) of the services, or None for SQLite ledgers."""
    replicated: bool = False
    """The replica variant: Redis with a replica, the services at durability ``replica`` (:data:`DURABILITY`)."""
    clustered: bool = False
    """The cluster variant: :data:`MASTERS` masters, each behind its proxy, instead of :attr:`server`."""
    server: RedisServer | None = field(init=False, default=None)
    replica: ReplicaServer | None = field(init=False, default=None)
    cluster: FaultCluster | None = field(init=False, default=None)
    victim: int = field(init=False, default=-1)
    """The cluster variant: the master that ``master_down`` takes down (it holds none of :data:`SHARED_KEYS`)."""
    outages: list[Outage] = field(init=False, default_factory=list)
    proxy: FaultProxy | ProxyGroup = field(init=False)
    ledgers: list[Ledger] = field(init=False)
    deliveries: Path = field(init=False)
    """Where the consumers record their deliveries."""
    producers: list[Worker] = field(default_factory=list)
    checkers: list[Worker] = field(default_factory=list)
    consumers: list[Worker] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.workdir / "redis").mkdir()
        (self.workdir / "logs").mkdir()
        self.deliveries = self.workdir / "deliveries"
        self.deliveries.mkdir()
        if self.clustered:
            ports: list[int] = []
            for _ in range(MASTERS):
                ports.append(cluster_port(ports))
            self.cluster = FaultCluster(self.workdir / "redis", ports)
            self.proxy = ProxyGroup([FaultProxy(port) for port in ports])
        else:
            # a master restarted by a fault gets a new replication id: its replica resyncs in full, at once
            master_args = ("--repl-diskless-sync-delay", "0") if self.replicated else ()
            self.server = RedisServer(self.workdir / "redis", master_args)
            if self.replicated:
                (self.workdir / "replica").mkdir()
                self.replica = ReplicaServer(self.workdir / "replica", self.server)
            self.proxy = FaultProxy(self.server.port)
        self.ledgers = [Ledger(self.workdir / f"service-{slot}.sqlite") for slot in range(self.sizes.producers)]

    @property
    def workers(self) -> list[Worker]:
        return [*self.producers, *self.checkers, *self.consumers]

    @property
    def topics(self) -> dict[str, int]:
        """Topic -> partitions of this variant."""
        return CLUSTER_TOPICS if self.clustered else TOPICS

    def client(self) -> Any:
        """A client of the test's own, straight to Redis (to every master of the cluster, not through the proxies)."""
        if self.cluster is not None:
            return self.cluster.client()
        assert self.server is not None
        return redis.Redis(port=self.server.port)

    def start(self) -> None:
        if self.database_url:
            from .pg_databases import create_schema

            create_schema(self.database_url)
        if self.cluster is not None:
            assert isinstance(self.proxy, ProxyGroup)
            self.proxy.start()
            self.cluster.start(self.proxy.ports)
            self.victim = self._victim(self.cluster)
        else:
            assert self.server is not None
            self.server.start()
            self.proxy.start()
        client = self.client()
        if self.replica is not None:
            self.replica.start()
            deadline = time.monotonic() + 30
            while not self.replica.acknowledges(client):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the replica on port {self.replica.port} does not acknowledge writes")
                time.sleep(0.1)
        for topic, partitions in self.topics.items():
            if partitions > 1:
                create_topic(client, topic, partitions)
        client.close()
        config = self.workdir / "config.json"
        config.write_text(json.dumps(self._config()))
        checker_options = {
            "--redis-url": self.proxy.url,
            "--transaction-timeout": SETTINGS["transaction_timeout"],
            "--check-interval": SETTINGS["check_interval"],
            "--check-max": SETTINGS["check_max"],
            "--claim-idle": SETTINGS["claim_idle"],
        }
        checker_env: dict[str, str] = {}
        if self.replicated:
            checker_options["--durability"] = DURABILITY["durability"]
            checker_env = {
                "TXMQ_DURABILITY_REPLICAS": str(DURABILITY["durability_replicas"]),
                "TXMQ_DURABILITY_TIMEOUT": str(DURABILITY["durability_timeout"]),
            }
        checker = [TXMQ, "--log-level", "INFO", "checker", *(str(x) for kv in checker_options.items() for x in kv)]
        if self.clustered:
            checker.append("--cluster")
        self.producers = [
            self._worker("producer", i, [sys.executable, "-m", producer_module(i), str(config), str(i)])
            for i in range(self.sizes.producers)
        ]
        self.checkers = [self._worker("checker", i, checker, checker_env) for i in range(self.sizes.checkers)]
        self.consumers = [
            self._worker("consumer", i, [sys.executable, "-m", "tests.faults.consumer_worker", str(config), str(i)])
            for i in range(self.sizes.consumers)
        ]
        for worker in self.workers:
            worker.start()

    def _worker(self, kind: str, index: int, argv: list[str], env: dict[str, str] | None = None) -> Worker:
        env = (env or {}) | ({"TXMQ_CLUSTER": "true"} if self.clustered else {})
        return Worker(f"{kind}-{index}", argv, self.workdir / "logs" / f"{kind}-{index}.log", env)

    def _victim(self, cluster: FaultCluster) -> int:
        """The master ``master_down`` takes down: one that holds none of :data:`SHARED_KEYS`. Every master must hold
        a partition of the topics, so that the faults hit traffic on each (the topics are fixed: a change of
        :data:`CLUSTER_TOPICS` or of a key's name may need a new layout)."""
        busy = {cluster.master_of(key) for key in SHARED_KEYS}
        free = [master for master in range(MASTERS) if master not in busy]
        spread = collections.Counter(cluster.master_of(keys.topic_stream) for keys in self.partitions())
        if not free or len(spread) < MASTERS:
            raise RuntimeError(
                f"the cluster variant needs a master without the shared keys (those are on masters {sorted(busy)}) "
                f"and a partition on every master (partitions per master: {dict(spread)}): change CLUSTER_TOPICS"
            )
        return free[0]

    def partitions(self) -> list[TopicKeys]:
        """The keys of every partition of this variant's topics."""
        return [keys for topic, count in self.topics.items() for keys in partition_keys_of(topic, count)]

    @property
    def masters(self) -> int:
        """The number of cluster masters (0 off a cluster)."""
        return len(self.cluster.ports) if self.cluster is not None else 0

    def kill_redis(self, target: int) -> None:
        """SIGKILL Redis (on a cluster, master ``target`` modulo their number)."""
        if self.cluster is not None:
            self.cluster.kill(target % self.masters)
        else:
            assert self.server is not None
            self.server.kill()

    def restart_redis(self, target: int) -> None:
        """Start again what :meth:`kill_redis` killed (a cluster master: once it says ``cluster_state:ok``)."""
        if self.cluster is not None:
            self.cluster.restart(target % self.masters)
        else:
            assert self.server is not None
            self.server.start()

    def master_down(self, seconds: float) -> Outage:
        """SIGKILL the :attr:`victim` master, restart it ``seconds`` later, and record what the other masters'
        partitions, the producers and the consumers did meanwhile; before the restart, wait (at most
        :data:`CATCH_UP_SECONDS`) until the consumers have received every entry of the other partitions."""
        cluster = self.cluster
        if cluster is None:
            raise ValueError("master_down needs the cluster variant (System(clustered=True))")
        client = cluster.client()
        before = self.progress(client)
        sending = [done > 0 and not self.sent(slot) for slot, done in enumerate(before.sends)]
        cluster.kill(self.victim)
        try:
            time.sleep(seconds)
            after = self.progress(client)
            behind, caught_up = self._catch_up(after.entries)
        finally:
            client.close()
            cluster.restart(self.victim)
        outage = Outage(
            seconds,
            sending,
            len(after.entries - before.entries),
            after.ends - before.ends,
            after.deliveries - before.deliveries,
            [b - a for a, b in zip(before.sends, after.sends, strict=True)],
            behind,
            caught_up,
        )
        self.outages.append(outage)
        return outage

    def _catch_up(self, entries: set[tuple[str, str]]) -> tuple[int, float]:
        """Wait until the consumers have recorded every one of ``entries`` (stream, id); how many they had not
        after :data:`CATCH_UP_SECONDS`, and how long it took."""
        from .observe import deliveries

        started = time.monotonic()
        while True:
            missing = entries - {(d.stream, d.id) for d in deliveries(self.deliveries)}
            waited = time.monotonic() - started
            if not missing or waited > CATCH_UP_SECONDS:
                return len(missing), waited
            time.sleep(0.1)

    def progress(self, client: Any) -> Progress:
        """What the system has done so far (:class:`Progress`), read from the masters other than the victim."""
        from .observe import deliveries

        assert self.cluster is not None
        up = [keys for keys in self.partitions() if self.cluster.master_of(keys.topic_stream) != self.victim]
        streams = {keys.topic_stream for keys in up}
        entries = {
            (keys.topic_stream, entry_id.decode()) for keys in up for entry_id, _ in client.xrange(keys.topic_stream)
        }
        ends = collections.Counter(
            fields[b"source"].decode() for keys in up for _, fields in client.xrange(keys.op_stream)
        )
        return Progress(
            entries,
            ends,
            sum(1 for d in deliveries(self.deliveries) if d.stream in streams),
            [ledger.finished() for ledger in self.ledgers],
        )

    def _config(self) -> dict[str, Any]:
        count, slots = self.sizes.transactions, self.sizes.producers
        return {
            "redis_url": self.proxy.url,
            "producer_group": PRODUCER_GROUP,
            "consumer_group": CONSUMER_GROUP,
            "topics": list(self.topics),
            "ledgers": [str(ledger.path) for ledger in self.ledgers],
            "database_url": self.database_url,
            "deliveries": str(self.deliveries),
            "seed": self.seed,
            "quotas": [count // slots + (1 if slot < count % slots else 0) for slot in range(slots)],
            "rate": self.sizes.rate / slots,
            "oneway_slots": [slots - 1] if slots > 1 else [],
            "consumer_loops": list(CONSUMER_LOOPS),
            "settings": SETTINGS
            | {"heartbeat_interval": HEARTBEAT_INTERVAL, "cluster": self.clustered}
            | (DURABILITY if self.replicated else {}),
            "consumer": CONSUMER,
        } | (REPLICA_MIX if self.replicated else {})

    def committed(self) -> dict[str, str]:
        """The ground truth: transaction id -> topic of every committed order."""
        if self.database_url:
            from .pg_databases import OrderDatabase

            database = OrderDatabase(self.database_url)
            try:
                return database.committed()
            finally:
                database.close()
        truth: dict[str, str] = {}
        for ledger in self.ledgers:
            truth |= ledger.committed()
        return truth

    def aborted(self) -> int:
        """Transactions a check-back found without their order and aborted for good (tombstones or fences)."""
        if self.database_url:
            from .pg_databases import OrderDatabase

            database = OrderDatabase(self.database_url)
            try:
                return database.fenced()
            finally:
                database.close()
        return sum(ledger.aborted() for ledger in self.ledgers)

    def billed(self) -> collections.Counter[str] | None:
        """Transaction id -> invoices in the consumer group's database (PostgreSQL variant; else None)."""
        if not self.database_url:
            return None
        from .pg_databases import BillingDatabase

        database = BillingDatabase(self.database_url, CONSUMER_GROUP)
        try:
            return database.billed()
        finally:
            database.close()

    def restart_exited(self) -> None:
        """Restart every worker that ended on its own (a finding: kept in :attr:`exits` with its log's tail)."""
        for worker in self.workers:
            status = worker.exited()
            if status is not None:
                self.exits.append(Exit(worker.name, status, worker.tail(1)))
                worker.kill()
                worker.start()

    def kill_after_decision(self, slot: int, timeout: float) -> bool:
        """Have producer ``slot`` SIGKILL itself right after its next decision of a transaction of several messages
        (having ended a random number of them); True if it did within ``timeout`` seconds, else it is SIGKILLed
        anyway (its sends may not bring such a decision in time). The producer stays down until restarted."""
        flag, victim = kill_flag(self.ledgers[slot].path), self.producers[slot]
        flag.touch()
        victim.wait(timeout)
        landed = victim.exited() is not None
        flag.unlink(missing_ok=True)
        victim.kill()
        return landed

    def sent(self, slot: int) -> bool:
        """Producer ``slot`` has sent its quota."""
        return Path(f"{self.ledgers[slot].path}.done").exists()

    def all_sent(self) -> bool:
        """Every producer slot has sent its quota."""
        return all(self.sent(slot) for slot in range(len(self.ledgers)))

    def logs(self, lines: int = 25) -> str:
        """The tail of every worker's log, for a failure message."""
        return "\n".join(f"--- {worker.name}\n{worker.tail(lines)}" for worker in self.workers)

    def stop(self) -> None:
        """SIGTERM to every worker, SIGKILL to those still running 5 s later; then the proxy, Redis and its replica
        (or the cluster). Safe after a failed :meth:`start`."""
        deadline = time.monotonic() + 5
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            worker.wait(max(0.0, deadline - time.monotonic()))
            worker.kill()
        for ledger in self.ledgers:
            ledger.close()
        self.proxy.stop()
        if self.server is not None:
            self.server.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self.replica is not None:
            self.replica.stop()
