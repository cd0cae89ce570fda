"""Liveness and readiness of one checker, served as ``/healthz`` and ``/readyz`` next to ``/metrics``.

The checker's loop reports what it did (a round ended, a step failed, a heartbeat landed, which topic streams failed
their scan); the probes only read that state, so a probe sends no command to Redis and answers at once even while
Redis hangs. Liveness asks one thing — is the loop still going round — because restarting the process is the cure
only for a stuck loop; readiness asks whether this checker is doing its work now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

LOOP_STALL_AFTER = 60.0
"""Default seconds without a round of the loop after which ``/healthz`` fails. A healthy round takes about a second,
a failing one waits at most 5 s (30 s between two attempts to start): a minute is several of the longest."""

TOPIC_FAILURES = 5
"""Default consecutive failed scans of one topic stream after which ``/readyz`` fails."""

MAIN_STEPS = ("start", "heartbeat", "scan", "replies")
"""The steps of the loop whose failure means that Redis cannot be reached (or refuses the checker)."""

ERROR_TEXT_MAX = 300


def _short(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:ERROR_TEXT_MAX]


class CheckerHealth:
    """What the loop last did, and the verdicts of the probes. Thread-safe: the loop writes, the HTTP server reads."""

    def __init__(
        self,
        stall_after: float = LOOP_STALL_AFTER,
        topic_failures: int = TOPIC_FAILURES,
        heartbeat_window: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stall_after <= 0:
            raise ValueError(f"stall_after must be > 0 seconds, got {stall_after}")
        if topic_failures < 1:
            raise ValueError(f"topic_failures must be >= 1, got {topic_failures}")
        self.stall_after = stall_after
        self.topic_failures = topic_failures
        self.heartbeat_window = heartbeat_window
        self._clock = clock
        self._lock = threading.Lock()
        self._last_round = clock()  # the process just started: its loop has had no time to go round yet
        self._rounds = 0
        self._started = False
        self._last_beat: float | None = None
        self._failing_now: dict[str, str] = {}
        self._failed: dict[str, str] = {}
        self._topic_failures: dict[str, tuple[int, str]] = {}

    # ------------------------------------------------------------------------------------ written by the loop

    def started(self) -> None:
        """Scripts loaded, reply group joined, first heartbeat written."""
        with self._lock:
            self._started = True
            self._last_beat = self._clock()
            self._failed.pop("start", None)

    def beat(self) -> None:
        with self._lock:
            self._last_beat = self._clock()

    def step_failed(self, step: str, exc: BaseException | str) -> None:
        with self._lock:
            self._failing_now[step] = _short(exc)

    def round_done(self) -> None:
        """One round of the loop ended (or one attempt to start): the steps that failed in it are its verdict."""
        with self._lock:
            self._failed = {step: error for step, error in self._failing_now.items() if step in MAIN_STEPS}
            self._failing_now = {}
            self._last_round = self._clock()
            self._rounds += 1

    def topics_scanned(self, streams: Iterable[str], failed: dict[str, BaseException]) -> dict[str, int]:
        """A scan went over ``streams``; ``failed`` are those whose scan failed. Returns the consecutive failures
        of every stream scanned (0: it passed); a stream no longer listed is forgotten."""
        with self._lock:
            counts: dict[str, tuple[int, str]] = {}
            for stream in streams:
                if stream in failed:
                    previous = self._topic_failures.get(stream, (0, ""))[0]
                    counts[stream] = (previous + 1, _short(failed[stream]))
            self._topic_failures = counts
            return {stream: counts.get(stream, (0, ""))[0] for stream in streams}

    # --------------------------------------------------------------------------------- read by the probes

    def _loop(self, now: float) -> dict[str, Any]:
        since = round(now - self._last_round, 3)  # the verdict and the figure shown agree, even at the limit
        return {"ok": since <= self.stall_after, "seconds_since_round": since, "limit": self.stall_after}

    def live(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: the loop went round within ``stall_after`` seconds."""
        with self._lock:
            checks = {"loop": self._loop(self._clock())}
        return self._verdict(checks)

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: the loop goes round, the scripts are loaded, the last round reached Redis, the heartbeat is
        fresh (within three heartbeat intervals: what ``txmq status`` counts as live), and no topic stream failed
        its last ``topic_failures`` scans in a row."""
        with self._lock:
            now = self._clock()
            # rounded first, as /healthz's: the verdict is taken on the figure shown
            beat_age = None if self._last_beat is None else round(now - self._last_beat, 3)
            failing = {
                stream: {"rounds": count, "error": error}
                for stream, (count, error) in sorted(self._topic_failures.items())
                if count >= self.topic_failures
            }
            checks: dict[str, Any] = {
                "loop": self._loop(now),
                "scripts": {"ok": self._started},
                "redis": {"ok": self._started and not self._failed},
                "heartbeat": {
                    "ok": beat_age is not None and beat_age <= self.heartbeat_window,
                    "seconds_since_beat": beat_age,
                    "limit": self.heartbeat_window,
                },
                "topics": {"ok": not failing, "limit": self.topic_failures},
            }
            if self._failed:
                checks["redis"]["failed_steps"] = dict(self._failed)
            if failing:
                checks["topics"]["failing"] = failing
        return self._verdict(checks)

    @staticmethod
    def _verdict(checks: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        ok = all(check["ok"] for check in checks.values())
        body: dict[str, Any] = {"status": "ok" if ok else "failing", "checks": checks}
        if not ok:
            body["failed"] = [name for name, check in checks.items() if not check["ok"]]
        return ok, body
