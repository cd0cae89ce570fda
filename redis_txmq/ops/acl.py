"""Least-privilege ACL rules for each part: a producer, a checker, a consumer, a Spark reader, a Spark writer and the
console (read-only).

Each rule names only the keys of the part's topics and groups (``redis_txmq.core.keys``) and only the commands it sends,
including those its Lua scripts call: Redis checks every command inside a script against the caller's ACL, so a script
is no way around it. ``EVAL`` is allowed next to ``EVALSHA`` (redis-py falls back to it) for the same reason. ``INFO``
lets a producer or checker check its durability level at start (without it the level is not checked, and ``txmq status``
shows the server as unknown). The rules are what ``txmq acl`` prints and what the tests run every part with."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.errors import ConfigurationError
from ..core.keys import (
    AUDIT_STREAM,
    CHECKER_INSTANCES,
    CHECKER_LEVELS,
    GROUP_REGISTRY,
    JOB_REGISTRY,
    PREFIX,
    REPLY_STREAM,
    SCHEDULE,
    TOPIC_REGISTRY,
)
from ..core.message import validate_name

CONNECTION = ("hello", "ping")
"""What redis-py may send on a new connection (its CLIENT SETINFO, refused, is ignored; Redis 7.0 has none)."""
SCRIPTS = ("evalsha", "eval", "script|load")
TRANSACTION_COMMANDS = (
    *CONNECTION,
    *SCRIPTS,
    "info",
    "time",
    "type",
    "exists",
    "del",
    "pexpire",
    "persist",
    "hget",
    "hset",
    "hdel",
    "hexists",
    "hincrby",
    "hlen",
    "hmget",
    "hgetall",
    "hscan",
    "sadd",
    "smembers",
    "smismember",
    "srem",
    "zadd",
    "zrem",
    "zcount",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zscore",
    "zmscore",
    "zremrangebyscore",
    "xadd",
    "xlen",
    "xrange",
    "xdel",
    "xtrim",
    "xack",
    "xpending",
    "xreadgroup",
    "xautoclaim",
    "xclaim",
    "xgroup|create",
    "xinfo|consumers",
    "multi",
    "exec",
)
"""A producer's and a checker's: the transaction scripts, heartbeats, check requests and answers, decisions of
transactions of several messages, the settling of write jobs a Spark driver left (and what ``txmq status`` reads:
the checker's user is enough for it)."""
CONSUMER_COMMANDS = (
    *CONNECTION,
    *SCRIPTS,
    "time",
    "hget",
    "hset",
    "hdel",
    "hgetall",
    "xadd",
    "xrange",
    "xack",
    "xpending",
    "xreadgroup",
    "xautoclaim",
    "xclaim",
    "xgroup|create",
    "xgroup|delconsumer",
    "xinfo|consumers",
)
"""A consumer's. It appends (XADD) to its group's dead-letter streams from a script whose KEYS are the topic stream
and that dead-letter stream; Redis checks a script call's keys all against one set of permissions (a selector
cannot hold the XADD apart), so the topic streams are writable by XADD too. HSET, HDEL and HGETALL are for its
group's leases (``consumer-leases:<group>``: its heartbeat, its hand-back, the removal of gone consumers).
XAUTOCLAIM is what consumers of releases before the leases claim with: one user serves both while you upgrade."""
SPARK_COMMANDS = (*CONNECTION, "exists", "hget", "xlen", "xrange", "xinfo|stream")
SPARK_WRITER_COMMANDS = (
    *CONNECTION,
    *SCRIPTS,
    "time",
    "exists",
    "del",
    "pexpire",
    "hget",
    "hmget",
    "hset",
    "hdel",
    "hincrby",
    "sadd",
    "smembers",
    "smismember",
    "srem",
    "zadd",
    "zrem",
    "xadd",
    "xlen",
    "xrange",
    "xtrim",
)
"""A Spark writer's: its stages, its jobs' decisions (and a sink's last batch), publishing into the topic streams."""
CONSOLE_COMMANDS = (
    *CONNECTION,
    "info",
    "time",
    "exists",
    "hget",
    "hmget",
    "hexists",
    "hlen",
    "hgetall",
    "hscan",
    "smembers",
    "scard",
    "smismember",
    "zcount",
    "zcard",
    "zrange",
    "zrevrange",
    "zrangebyscore",
    "xlen",
    "xrange",
    "xrevrange",
    "xpending",
    "xinfo|groups",
    "xinfo|stream",
)
"""The console's (``txmq console``): reads only, and on read-only key patterns (``%R~``) besides: what it shows is
``txmq status``'s figures, the messages and transactions of the topics, the write jobs and the audit trail. Its
actions run under the operator's own user, never this one."""
DECISIONS = f"{PREFIX}:decision:*"
"""Decisions of transactions of several messages: named by random transaction ids, so no narrower pattern fits."""
JOBS = (JOB_REGISTRY, f"{PREFIX}:job:*", f"{PREFIX}:sink:*")
ROLES = ("producer", "checker", "consumer", "spark", "spark-writer", "console")
DURABILITY_COMMANDS: dict[str, tuple[str, ...]] = {"master": (), "replica": ("wait",), "aof": ("waitaof",)}
"""What a durability level adds to the roles that write (producer, checker, Spark writer): its confirming command
(``WAITAOF`` exists from Redis 7.2 on: an older server refuses the rule)."""


def _topic_keys(topics: Iterable[str]) -> list[str]:
    """Key patterns of topics: the stream of each partition and their companions, and the topic's metadata."""
    patterns = []
    for topic in topics:
        validate_name(topic, "topic")  # letters, digits and _.:- only: nothing an ACL pattern would expand
        patterns += [topic, f"{topic}#*", f"{PREFIX}:{{{topic}}}:*", f"{PREFIX}:{{{topic}#*}}:*"]
        patterns.append(f"{PREFIX}:topic:{{{topic}}}")
    return patterns


def acl_rules(
    role: str,
    *,
    topics: Iterable[str],
    producer_groups: Iterable[str] = (),
    consumer_group: str | None = None,
    durability: str = "master",
) -> list[str]:
    """The ``ACL SETUSER`` arguments (after the user name) for ``role`` on ``topics``, one rule each (a selector,
    in parentheses, is one argument): a producer of
    ``producer_groups`` (one, usually), a checker of every group in ``producer_groups`` (empty: all groups), a
    consumer in ``consumer_group``, a Spark reader (read-only keys) or a Spark writer (its stages, its jobs, the
    topic streams), or the console (read-only: every key it reads, of ``topics``, or of every topic when none is
    named). Starts with ``resetkeys -@all``. A ``durability`` level other than ``master`` allows its confirming
    command to the roles that write."""
    topics = list(topics)
    if role not in ROLES:
        raise ConfigurationError(f"ACL role must be one of {', '.join(ROLES)}, got {role!r}")
    if durability not in DURABILITY_COMMANDS:
        raise ConfigurationError(f"durability must be one of {', '.join(DURABILITY_COMMANDS)}, got {durability!r}")
    if role == "console":
        return _console_rules(topics)
    if not topics:
        raise ConfigurationError(f"ACL rules for a {role}: name at least one topic")
    groups = list(producer_groups)
    for group in groups:
        validate_name(group, "producer group")
    commands: tuple[str, ...]
    if role == "producer":
        if not groups:
            raise ConfigurationError("ACL rules for a producer: name its producer group")
        keys = _topic_keys(topics) + [f"{PREFIX}:group:{{{g}}}:*" for g in groups]
        keys += [TOPIC_REGISTRY, GROUP_REGISTRY, SCHEDULE, REPLY_STREAM, DECISIONS]
        commands = TRANSACTION_COMMANDS
    elif role == "checker":
        group_keys = [f"{PREFIX}:group:{{{g}}}:*" for g in groups] or [f"{PREFIX}:group:*"]
        keys = _topic_keys(topics) + group_keys
        keys += [TOPIC_REGISTRY, GROUP_REGISTRY, SCHEDULE, REPLY_STREAM, CHECKER_INSTANCES, CHECKER_LEVELS, DECISIONS]
        keys += JOBS
        commands = (*TRANSACTION_COMMANDS, "xinfo|groups")  # the consumer groups' lag (metrics, txmq status)
    elif role == "consumer":
        if not consumer_group:
            raise ConfigurationError("ACL rules for a consumer: name its consumer group")
        validate_name(consumer_group, "consumer group")
        keys = []
        for topic in topics:
            validate_name(topic, "topic")
            keys += [f"~{topic}", f"~{topic}#*", f"%R~{PREFIX}:topic:{{{topic}}}"]
            for companion in ("consumer-dead", "consumer-leases"):
                keys += [f"~{PREFIX}:{{{topic}}}:{companion}:{consumer_group}"]
                keys += [f"~{PREFIX}:{{{topic}#*}}:{companion}:{consumer_group}"]
        return ["resetkeys", *keys, "resetchannels", "-@all", *(f"+{c}" for c in CONSUMER_COMMANDS)]
    elif role == "spark-writer":
        keys = _topic_keys(topics) + list(JOBS)
        commands = SPARK_WRITER_COMMANDS
    else:
        keys = []
        for topic in topics:
            validate_name(topic, "topic")
            keys += [f"%R~{topic}", f"%R~{topic}#*", f"%R~{PREFIX}:topic:{{{topic}}}"]
        return ["resetkeys", *keys, "resetchannels", "-@all", *(f"+{c}" for c in SPARK_COMMANDS)]
    commands += DURABILITY_COMMANDS[durability]
    return ["resetkeys", *(f"~{k}" for k in keys), "resetchannels", "-@all", *(f"+{c}" for c in commands)]


def _console_rules(topics: list[str]) -> list[str]:
    """Read-only patterns (``%R~``) for the console: the topics' keys (any key when no topic is named: topic names
    are the stream keys themselves, so "every topic" has no narrower pattern), the registries, producer groups,
    checkers, decisions, write jobs and the audit trail."""
    keys = _topic_keys(topics) if topics else ["*"]
    keys += [TOPIC_REGISTRY, GROUP_REGISTRY, SCHEDULE, CHECKER_INSTANCES, CHECKER_LEVELS, f"{PREFIX}:group:*"]
    keys += [DECISIONS, *JOBS, AUDIT_STREAM]
    commands = (f"+{c}" for c in CONSOLE_COMMANDS)
    return ["resetkeys", *(f"%R~{k}" for k in dict.fromkeys(keys)), "resetchannels", "-@all", *commands]
