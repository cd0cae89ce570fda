"""Liveness of producer and checker instances, on the Redis server's clock."""

from __future__ import annotations

from typing import Any

from .config import Settings
from .keys import CHECKER_INSTANCES, CHECKER_LEVELS, GroupKeys
from .preload import preload
from .scripts import register_script


class Heartbeat:
    """Registers an instance as live in a zset, on the server's clock, with the durability level it writes with
    (``lua/heartbeat.lua``; ``txmq status`` counts the live instances per level)."""

    def __init__(
        self, client: Any, instances_key: str, levels_key: str, instance_id: str, interval: float, level: str
    ) -> None:
        self.client = client
        self.instances_key = instances_key
        self.levels_key = levels_key
        self.level = level
        self.instance_id = instance_id
        self.live_ms = int(interval * 3000)
        self.script = register_script(client, "heartbeat")

    @classmethod
    def of_producer(cls, client: Any, keys: GroupKeys, instance_id: str, settings: Settings) -> Heartbeat:
        """A producer instance's, in its group's zset and level hash."""
        interval, level = settings.heartbeat_interval, settings.durability
        return cls(client, keys.producers, keys.durability_levels, instance_id, interval, level)

    @classmethod
    def of_checker(cls, client: Any, instance_id: str, settings: Settings) -> Heartbeat:
        """A checker instance's, in the checkers' zset and level hash."""
        interval, level = settings.heartbeat_interval, settings.durability
        return cls(client, CHECKER_INSTANCES, CHECKER_LEVELS, instance_id, interval, level)

    def load(self) -> None:
        preload(self.script)

    def beat(self) -> int:
        """Record this instance; returns how many instances are live."""
        return int(self.call("beat"))

    def leave(self) -> None:
        self.call("leave")

    def call(self, action: str) -> Any:
        """The script call for ``beat`` or ``leave``: its reply, or an awaitable on a ``redis.asyncio`` client."""
        keys = [self.instances_key, self.levels_key]
        return self.script(keys=keys, args=[self.instance_id, self.live_ms, action, self.level])
