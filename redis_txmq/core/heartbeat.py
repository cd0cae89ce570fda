"""Liveness of producer and checker instances, on the Redis server's clock."""

from __future__ import annotations

from typing import Any

from .config import Settings
from .keys import CHECKER_INSTANCES, CHECKER_LEVELS, GroupKeys
from .layout import LAYOUT_VERSION
from .scripts import register_script


class Heartbeat:
    """Registers an instance as live in a zset, on the server's clock, with the durability level it writes with
    (``lua/heartbeat.lua``; ``txmq status`` counts the live instances per level) and, given ``layouts_key``, the key
    layout version it writes (``redis_txmq.core.layout``: a checker tells an older producer by its missing record)."""

    def __init__(
        self,
        client: Any,
        instances_key: str,
        levels_key: str,
        instance_id: str,
        interval: float,
        level: str,
        layouts_key: str = "",
        layout: int = LAYOUT_VERSION,
    ) -> None:
        self.client = client
        self.instances_key = instances_key
        self.levels_key = levels_key
        self.layouts_key = layouts_key
        self.layout = layout
        self.level = level
        self.instance_id = instance_id
        self.live_ms = int(interval * 3000)
        self.script = register_script(client, "heartbeat")

    @classmethod
    def of_producer(cls, client: Any, keys: GroupKeys, instance_id: str, settings: Settings) -> Heartbeat:
        """A producer instance's, in its group's zset, level hash and layouts hash (with ``LAYOUT_VERSION``)."""
        interval, level = settings.heartbeat_interval, settings.durability
        return cls(client, keys.producers, keys.durability_levels, instance_id, interval, level, keys.layouts)

    @classmethod
    def of_checker(cls, client: Any, instance_id: str, settings: Settings) -> Heartbeat:
        """A checker instance's, in the checkers' zset and level hash; no layout record (nothing asks for a
        checker's, and the ``txmq acl checker`` rules name the checkers' keys one by one)."""
        interval, level = settings.heartbeat_interval, settings.durability
        return cls(client, CHECKER_INSTANCES, CHECKER_LEVELS, instance_id, interval, level)

    def beat(self) -> int:
        """Record this instance; returns how many instances are live."""
        return int(self.call("beat"))

    def leave(self) -> None:
        self.call("leave")

    def call(self, action: str) -> Any:
        """The script call for ``beat`` or ``leave``: its reply, or an awaitable on a ``redis.asyncio`` client."""
        keys = [self.instances_key, self.levels_key]
        args: list[Any] = [self.instance_id, self.live_ms, action, self.level]
        if self.layouts_key:
            keys.append(self.layouts_key)
            args.append(self.layout)
        return self.script(keys=keys, args=args)
