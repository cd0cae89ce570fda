-- Prelude of every transaction script: the loader (redis_txmq/core/scripts.py) puts it in front of the script.
-- It only binds names: the helpers the other scripts share are in topic_lib.lua, which the two scripts of every
-- send (prepare_half, end_transaction) do without, because each function a script defines is a closure made
-- again on every call.
-- It binds KEYS, which the caller passes in the order of redis_txmq.core.keys.TopicKeys.script_keys(); every key is
-- in the hash slot of the topic stream (hash tag {<topic stream key>}), so these scripts also run on Cluster.
--
-- KEYS[1]  half_stream   stream  half messages of in-flight transactions
-- KEYS[2]  op_stream     stream  outcome records, capped
-- KEYS[3]  dead_stream   stream  transactions the checker gave up on
-- KEYS[4]  topic_stream  stream  committed messages: what consumers read
-- KEYS[5]  inflight      hash    transaction id -> half message id
-- KEYS[6]  ended         hash    transaction id -> "<state>|<committed id or ->|<half id>|<producer group>"
-- KEYS[7]  ended_at      zset    transaction id -> end time in ms, to forget `ended` after the dedupe window
-- KEYS[8]  unchecked     zset    transaction id -> born time in ms (no own immunity, never checked yet)
-- KEYS[9]  due           zset    transaction id -> time of the next check in ms
-- KEYS[10] checks        hash    transaction id -> number of checks so far
-- KEYS[11] remarks       hash    transaction id -> last remark
-- KEYS[12] dead_index    hash    transaction id -> entry id in dead_stream
-- KEYS[13] requests      hash    transaction id -> entry id of its pending check request (in its group's stream,
--                                another slot: the caller deletes the entry when a script returns its id)
-- KEYS[14] schedule      zset    optional, txmq:schedule: topic stream -> when a checker looks at it next (another
--                                slot: passed only where one call may touch both, i.e. not on Cluster; the
--                                scripts that wake a topic then write it, else reply that the caller must)
--
-- Replies are tables: {'OK', ...} or {'ERR', code, detail}; the Python side maps codes to exceptions.

local half_stream, op_stream, dead_stream, topic_stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local inflight, ended, ended_at = KEYS[5], KEYS[6], KEYS[7]
local unchecked, due, checks, remarks, dead_index = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local requests, schedule = KEYS[13], KEYS[14]
