"""The send path's fast lane (``ScriptRunner``): same replies and errors as redis-py's ``Script``, recovery from a
lost connection and from a flushed script cache, its own connections closed on ``close()``."""

from __future__ import annotations

import pytest
import redis

from redis_txmq.core.keys import TopicKeys
from redis_txmq.core.scripts import register_topic_script
from redis_txmq.sync import wire
from redis_txmq.transport.direct import ScriptRunner

ECHO_OR_FAIL = """
if ARGV[1] == 'fail' then return redis.error_reply('ERR refused ' .. KEYS[1]) end
redis.call('INCR', KEYS[1])
return {KEYS[1], ARGV[1]}
"""


@pytest.fixture
def runner(client):
    runner = ScriptRunner(client, wire.run_scripts)
    yield runner
    runner.close()


def test_standalone_clients_take_the_direct_lane(client, runner):
    assert runner.direct
    assert not ScriptRunner(redis.Redis(single_connection_client=True), wire.run_scripts).direct


def test_run_gives_the_reply_and_raises_refusals(client, runner):
    script = client.register_script(ECHO_OR_FAIL)
    assert runner.run(script, ["k"], ["hello"]) == [b"k", b"hello"]
    with pytest.raises(redis.ResponseError, match="refused k"):
        runner.run(script, ["k"], ["fail"])
    assert runner.run(script, ["k"], [42]) == [b"k", b"42"]
    assert client.get("k") == b"2"


def test_run_many_keeps_order_and_puts_refusals_in_place(client, runner):
    script = client.register_script(ECHO_OR_FAIL)
    replies = runner.run_many([(script, [f"k{i}"], ["fail" if i == 2 else str(i)]) for i in range(5)])
    assert [r if isinstance(r, list) else "refused" for r in replies] == [
        [b"k0", b"0"],
        [b"k1", b"1"],
        "refused",
        [b"k3", b"3"],
        [b"k4", b"4"],
    ]
    assert isinstance(replies[2], redis.ResponseError)
    assert runner.run_many([]) == []


def test_script_cache_flushed_between_calls(client, runner):
    script = client.register_script(ECHO_OR_FAIL)
    assert runner.run(script, ["k"], ["a"]) == [b"k", b"a"]
    client.script_flush()
    assert runner.run(script, ["k"], ["b"]) == [b"k", b"b"]
    client.script_flush()
    assert [r[1] for r in runner.run_many([(script, ["k"], ["c"]), (script, ["k"], ["d"])])] == [b"c", b"d"]


def test_a_killed_connection_is_reopened(real_client, redis_url):
    client = redis.Redis.from_url(redis_url)
    runner = ScriptRunner(client, wire.run_scripts)
    script = client.register_script(ECHO_OR_FAIL)
    try:
        assert runner.run(script, ["k"], ["before"]) == [b"k", b"before"]
        real_client.client_kill_filter(_type="normal", skipme=True)
        assert runner.run(script, ["k"], ["after"]) == [b"k", b"after"]
    finally:
        runner.close()
        client.close()


def test_a_script_missing_again_on_the_socket_its_calls_are_resent_on_is_loaded_there(real_client, redis_url):
    """NOSCRIPT is answered by loading the script and sending its calls again. When that write meets a dropped
    connection, it is tried again on a new socket, which after a failover reaches a new master without the script:
    the second try loads it there too (it used to send the calls alone, and fail them with NOSCRIPT)."""
    sends: list[bytes] = []

    class Dropping(redis.Connection):
        def send_packed_command(self, command, check_health=True):
            payload = b"".join(bytes(part) for part in command) if isinstance(command, list) else bytes(command)
            if b"EVALSHA" in payload:
                sends.append(payload)
                if len(sends) == 2:  # the calls sent again after NOSCRIPT: the server loses its scripts, the socket
                    real_client.script_flush()
                    raise redis.ConnectionError("connection reset by the test")
            return super().send_packed_command(command, check_health)

    kwargs = real_client.connection_pool.connection_kwargs
    conn = Dropping(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0))
    script = real_client.register_script(ECHO_OR_FAIL)
    real_client.script_flush()
    try:
        replies, _ = wire.run_scripts(conn, [(script, ["k"], ["once"])], pack=None, durability=None)
    finally:
        conn.disconnect()
    assert replies == [[b"k", b"once"]]
    assert len(sends) == 3 and b"SCRIPT" in sends[2]
    assert real_client.get("k") == b"1"


def test_close_releases_the_runners_connections(real_client, redis_url):
    client = redis.Redis.from_url(redis_url)
    runner = ScriptRunner(client, wire.run_scripts)
    script = client.register_script(ECHO_OR_FAIL)
    before = len(real_client.client_list())
    runner.run(script, ["k"], ["x"])
    assert len(real_client.client_list()) == before + 1
    runner.close()
    assert len(real_client.client_list()) == before
    client.close()


def test_prepares_and_ends_of_one_partition_in_one_write_go_as_one_batch_call(real_client, redis_url):
    """The sync runner's writes of many calls (a one-way producer's flusher, a checker's answers, the messages of a
    transaction of several) send the prepares, and the ends, of one topic partition as one call of their batch
    script (lua/prepare_halves.lua, lua/end_transactions.lua); each call still gets its own reply, or its error."""
    client = redis.Redis.from_url(redis_url)
    runner = ScriptRunner(client, wire.run_scripts)
    prepare = register_topic_script(client, "prepare_half")
    end = register_topic_script(client, "end_transaction")
    topics = (TopicKeys("orders"), TopicKeys("audit"))
    for name in ("prepare_half", "prepare_halves", "end_transactions"):  # loaded: the counts are of calls that ran
        real_client.script_load(register_topic_script(client, name).script)
    try:
        prepares = [
            (prepare, keys.script_keys(), [f"{keys.topic}-{i}", "g", keys.topic, "0", b"x", "", "", "", ""])
            for keys in topics
            for i in range(3)
        ]
        real_client.config_resetstat()
        prepared = runner.run_many(prepares)
        assert [reply[3] for reply in prepared] == [b"NEW"] * 6
        assert real_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 2, "one call per partition"
        ends = [
            (end, keys.script_keys(), [f"{keys.topic}-{i}", "g", "COMMIT", "producer", "", 60_000, 1000, ""])
            for keys in topics
            for i in range(3)
        ]
        ends.append((end, topics[0].script_keys(), ["orders-0", "g", "ROLLBACK", "producer", "", 60_000, 1000, ""]))
        ends.append((prepare, topics[1].script_keys(), ["", "g", "audit", "0", b"x", "", "", "", ""]))
        real_client.config_resetstat()
        replies = runner.run_many(ends)
        assert real_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 3, "two batches, one prepare alone"
        assert [reply[4] for reply in replies[:6]] == [b"APPLIED"] * 6
        assert replies[6][:2] == [b"ERR", b"CONFLICT"] and replies[7][:2] == [b"ERR", b"BADARG"]
        for keys in topics:
            bodies = [fields[b"transaction_id"] for _, fields in real_client.xrange(keys.topic_stream)]
            assert bodies == [f"{keys.topic}-{i}".encode() for i in range(3)]
            assert real_client.hlen(keys.inflight) == 0
    finally:
        runner.close()
        client.close()
