-- prepare_half: write the half message of a new transaction (SPEC §4.2). Consumers cannot see it.
-- KEYS: the topic keys of topic_keys.lua (uses half_stream, inflight, ended, unchecked, due, dead_index, and
--       schedule when passed).
-- ARGV[1] transaction_id        client-made, unique; a retried call with the same id writes nothing new
-- ARGV[2] producer_group        the group whose live producers answer check-backs
-- ARGV[3] topic                 topic name (the message's, without partition suffix)
-- ARGV[4] partition             partition number, decimal
-- ARGV[5] body                  message bytes, unchanged
-- ARGV[6] keys                  space-separated keys, '' for none
-- ARGV[7] tags                  tag, '' for none
-- ARGV[8] properties            JSON object of str -> str, '' for none
-- ARGV[9] check_immunity_ms     the message's own check immunity, '' to use the checker's transaction_timeout
-- ARGV[10] parent_transaction_id  for one message of a transaction of several: that transaction's id (its
--                                 decision: decide_transaction.lua); '' or absent for a transaction of one message
-- Reply: {'OK', half_id, state, 'NEW' | 'DUPLICATE', wake} or {'ERR', code, detail}. wake is '' or, when the
--        topic must be woken in the checkers' schedule and KEYS[14] was not passed, the time (ms) to score it at:
--        the caller writes `ZADD txmq:schedule <wake> <topic stream>` after this call (Cluster).
-- Wake: the schedule holds each topic at or before its earliest check due (keys.SCHEDULE). A transaction that
-- joins a non-empty `unchecked` is due no earlier than the oldest one there (same immunity, born later), which the
-- schedule already covers; the first one into an empty `unchecked`, and any with its own immunity (it may be due
-- sooner), wakes the topic: scored at its birth, a checker looks at it in its next round. The score is set, not
-- only lowered: a look that did not see this transaction (made before it) wrote nothing yet, or wrote before the
-- wake; its write keeps a score at or after its own time (lua/schedule_topics.lua), and born is that.
-- One of the two calls of every send: no helper functions (see topic_keys.lua), seven commands on the common path
-- (eight, with the wake, when nothing else of the topic is unchecked).
-- The topic key's type is checked when a process first sends to the topic (redis_txmq.protocol.refuse_topic_key),
-- not here; the end refuses to commit onto a key of another type and keeps the transaction in flight.

local txid, group, topic, partition = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if txid == '' or group == '' or topic == '' then
  return {'ERR', 'BADARG', 'transaction_id, producer_group and topic must not be empty'}
end
if not string.find(partition, '^%d+$') then
  return {'ERR', 'BADARG', 'partition must be a whole number, got ' .. partition}
end
local immunity_ms = nil
if ARGV[9] ~= '' then
  immunity_ms = string.find(ARGV[9], '^%d+$') and tonumber(ARGV[9])
  if not immunity_ms or immunity_ms <= 0 or immunity_ms > 9007199254740992 then
    return {'ERR', 'BADARG', 'check_immunity_ms must be a whole number of ms from 1 to 2^53, got ' .. ARGV[9]}
  end
end

-- Idempotent: a retry after a lost reply finds the first half message.
local half_id = redis.call('HGET', inflight, txid)
if half_id then
  return {'OK', half_id, 'PREPARED', 'DUPLICATE'}
end
local prior = redis.call('HGET', ended, txid)
if prior then
  local state, _, prior_half = string.match(prior, '^([^|]+)|([^|]+)|([^|]+)')
  return {'OK', prior_half, state, 'DUPLICATE'}
end
if redis.call('HEXISTS', dead_index, txid) == 1 then
  return {'OK', '', 'DEAD', 'DUPLICATE'}
end

-- Times come from the Redis server, never from a client: clients' clocks skew. The milliseconds are put together
-- as text: a Lua number would go through printf and strtod on its way to the XADD and the ZADD.
local time = redis.call('TIME')
local born_ms = time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3)
local fields = {'transaction_id', txid, 'producer_group', group, 'topic', topic, 'partition', partition,
                'born_ms', born_ms, 'body', ARGV[5]}
if ARGV[6] ~= '' then fields[#fields + 1] = 'keys'; fields[#fields + 1] = ARGV[6] end
if ARGV[7] ~= '' then fields[#fields + 1] = 'tags'; fields[#fields + 1] = ARGV[7] end
if ARGV[8] ~= '' then fields[#fields + 1] = 'properties'; fields[#fields + 1] = ARGV[8] end
if ARGV[10] and ARGV[10] ~= '' then
  fields[#fields + 1] = 'parent_transaction_id'; fields[#fields + 1] = ARGV[10]
end
if immunity_ms then
  fields[#fields + 1] = 'check_immunity_ms'
  fields[#fields + 1] = string.format('%d', immunity_ms)
end

half_id = redis.call('XADD', half_stream, '*', unpack(fields))
redis.call('HSET', inflight, txid, half_id)
local wake = born_ms
if immunity_ms then
  redis.call('ZADD', due, string.format('%d', tonumber(born_ms) + immunity_ms), txid)
else
  if redis.call('EXISTS', unchecked) == 1 then
    wake = ''
  end
  redis.call('ZADD', unchecked, born_ms, txid)
end
if wake ~= '' and schedule then
  redis.call('ZADD', schedule, wake, topic_stream)
  wake = ''
end
return {'OK', half_id, 'PREPARED', 'NEW', wake}
