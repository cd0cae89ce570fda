"""The seeded fault schedule: which fault, on what, for how long, and the pause before the next one."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .harness import System

KINDS = ("reset", "blackhole", "delay", "redis", "producer", "checker", "consumer", "decided")
"""Proxy: reset every connection, blackhole, added latency. Redis: SIGKILL and restart on the same port and data
directory. Processes: SIGKILL of one producer, checker or consumer, and its restart; ``decided``: a producer
SIGKILLs itself between the decision of its next transaction of several messages and the end of all of them.

A reset comes while the proxy holds the traffic of the last ``latency`` seconds: commands that reached Redis lose
their reply, and redis-py's retries of them must change nothing."""

REPLICA_KINDS = ("replica_stall",)
"""Faults of the replica variant only (:attr:`System.replica`): ``replica_stall`` SIGSTOPs the replica for 1-3 s,
then SIGCONTs it. The services write at durability ``replica`` with a short timeout, so every prepare (of one
message, or one ``tx.send`` of several), decision, mark of a failed send and end meanwhile is applied on the master
but falls short of its confirmation."""
CLUSTER_KINDS = ("master_down",)
"""Faults of the cluster variant only (:attr:`System.cluster`): ``master_down`` SIGKILLs the master that holds none
of the keys every part shares (:attr:`System.victim`) for 2-5 s (longer than ``cluster-node-timeout``: the others
flag it as failing) and restarts it on its port and data directory, with its data; meanwhile its partitions wait and
the rest must go on (:meth:`System.master_down` records what the others did). On a cluster, ``redis`` SIGKILLs one
master of the three for a moment (any of them: the shared keys wait with it), and the proxy faults hit the proxies of
all of them at once."""
CLUSTER_DOWN_SHARE = 0.3
"""In the cluster variant, the chance that a ``master_down`` comes after each other fault (never two in a row)."""
DOWN_SECONDS = (2.0, 5.0)
"""How long a ``master_down`` keeps the master down (then it restarts, which takes about 2 s more: a restarted master
waits before it says ``cluster_state:ok``)."""
REPLICA_STALL_SHARE = 0.6
"""In the replica variant, the chance that a replica stall comes after each other fault (never two in a row, so
that the other kinds keep their pace): three faults in eight are stalls."""
LASTING = ("blackhole", "delay", "replica_stall")
"""Faults that last ``seconds`` (1-3 s)."""


DECIDED_WAIT = 10.0
"""How long a ``decided`` fault waits for the producer's next decision of several messages before it falls back to
a plain SIGKILL."""


@dataclass(frozen=True)
class Fault:
    kind: str
    seconds: float
    """Blackhole or delay duration; for a kill, how long the victim stays down."""
    latency: float
    target: int
    """Index of the process killed (modulo the number of such processes)."""
    pause: float
    """Seconds from the end of this fault's injection to the next fault."""

    def describe(self, masters: int = 0) -> str:
        """What the fault does; ``masters``: the number of cluster masters (0 off a cluster)."""
        if self.kind == "reset":
            return f"reset every connection, {self.latency * 1000:.0f} ms of traffic in flight"
        if self.kind == "blackhole":
            return f"blackhole {self.seconds:.1f} s"
        if self.kind == "delay":
            return f"delay {self.latency * 1000:.0f} ms for {self.seconds:.1f} s"
        if self.kind == "redis":
            which = f" master #{self.target % masters}" if masters else ""
            return f"SIGKILL redis{which}, down {self.seconds:.1f} s"
        if self.kind == "master_down":
            return f"SIGKILL the master without the shared keys, down {self.seconds:.1f} s"
        if self.kind == "decided":
            return f"SIGKILL producer #{self.target} after its next decision, down {self.seconds:.1f} s"
        if self.kind == "replica_stall":
            return f"SIGSTOP the replica for {self.seconds:.1f} s"
        return f"SIGKILL {self.kind} #{self.target}, down {self.seconds:.1f} s"


def kinds_of(system: System) -> tuple[str, ...]:
    """The kinds of fault ``system`` can take: :data:`KINDS`, and :data:`REPLICA_KINDS` when it has a replica or
    :data:`CLUSTER_KINDS` on a cluster."""
    if system.cluster is not None:
        return KINDS + CLUSTER_KINDS
    return KINDS + REPLICA_KINDS if system.replica is not None else KINDS


def plan(seed: int, kinds: tuple[str, ...] = KINDS, favoured: str | None = None, share: float = 0.0) -> Iterator[Fault]:
    """Endless faults from ``seed``: every kind once in a shuffled order, then kinds at random; ``favoured``, when
    given, comes after each of them with probability ``share``."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    kind = ""
    while True:
        if favoured is not None and kind != favoured and rng.random() < share:
            kind = favoured
        elif first:
            kind = first.pop(0)
        else:
            kind = rng.choice(kinds)
        if kind == "master_down":
            seconds = rng.uniform(*DOWN_SECONDS)
        else:
            seconds = rng.uniform(1.0, 3.0) if kind in LASTING else rng.uniform(0.1, 1.5)
        yield Fault(kind, seconds, rng.uniform(0.02, 0.3), rng.randrange(1000), rng.uniform(1.0, 3.0))


def plan_of(system: System) -> Iterator[Fault]:
    """The seeded plan of ``system``: replica stalls favoured in the replica variant, a master down in the cluster
    variant."""
    if system.cluster is not None:
        return plan(system.seed, kinds_of(system), "master_down", CLUSTER_DOWN_SHARE)
    if system.replica is None:
        return plan(system.seed)
    return plan(system.seed, kinds_of(system), "replica_stall", REPLICA_STALL_SHARE)


def inject(fault: Fault, system: System) -> bool:
    """Apply one fault; a kill returns once the victim has been started again. False when a ``decided`` fault fell
    back to a plain kill."""
    if fault.kind == "reset":
        system.proxy.delay(fault.latency, fault.latency * 2)
        time.sleep(fault.latency)
        system.proxy.reset_all()
    elif fault.kind == "blackhole":
        system.proxy.blackhole(fault.seconds)
    elif fault.kind == "delay":
        system.proxy.delay(fault.latency, fault.seconds)
    elif fault.kind == "redis":
        system.kill_redis(fault.target)
        time.sleep(fault.seconds)
        system.restart_redis(fault.target)
    elif fault.kind == "master_down":
        system.master_down(fault.seconds)
    elif fault.kind == "replica_stall":
        replica = system.replica
        if replica is None:
            raise ValueError("replica_stall needs the replica variant (System(replicated=True))")
        replica.stall()
        try:
            time.sleep(fault.seconds)
        finally:
            replica.resume()
    elif fault.kind == "decided":
        sending = [slot for slot in range(len(system.producers)) if not system.sent(slot)]
        slot = (sending or list(range(len(system.producers))))[fault.target % (len(sending) or len(system.producers))]
        landed = system.kill_after_decision(slot, DECIDED_WAIT)
        time.sleep(fault.seconds)
        system.producers[slot].start()
        return landed
    else:
        workers = {"producer": system.producers, "checker": system.checkers, "consumer": system.consumers}[fault.kind]
        victim = workers[fault.target % len(workers)]
        victim.kill()
        time.sleep(fault.seconds)
        victim.start()
    return True
