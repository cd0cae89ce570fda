-- fragment prepare_one: one prepare of a transaction, with every rule of lua/prepare_half.lua (SPEC §4.2): its
-- arguments checked, a repeat answered from the in-flight index, the remembered outcome or the dead letters, then
-- the half message written, indexed, and the topic woken in the checkers' schedule when it must be. Inlined by the
-- loader (lua/README.md) into prepare_half.lua (one prepare per call, at the script's top level). prepare_halves.lua
-- (many prepares of one topic partition per call) runs the same fragments for each prepare but the reads and writes
-- of the indexes, which it makes once for the call.
-- Expects in scope: the topic keys (topic_keys.lua);
--   at     the offset of this prepare's arguments in ARGV: ARGV[at + 1] .. ARGV[at + 10] are prepare_half's
--          ARGV[1] .. ARGV[10] (transaction_id, producer_group, topic, partition, body, keys, tags, properties,
--          check_immunity_ms, parent_transaction_id)
--   width  how many of them this prepare has (9 or more; ARGV[at + 10] is read only when it is 10 or more)
-- Returns the prepare's reply (prepare_half.lua's header), from the script or the function it is inlined in; every
-- path returns.
-- Wake: the schedule holds each topic at or before its earliest check due (keys.SCHEDULE). A transaction that
-- joins a non-empty `unchecked` is due no earlier than the oldest one there (same immunity, born later), which the
-- schedule already covers; the first one into an empty `unchecked`, and any with its own immunity (it may be due
-- sooner), wakes the topic: scored at its birth, a checker looks at it in its next round. The score is set, not
-- only lowered: a look that did not see this transaction (made before it) wrote nothing yet, or wrote before the
-- wake; its write keeps a score at or after its own time (lua/schedule_topics.lua), and born is that.
-- prepare_halves.lua follows the same rule for each prepare in turn. A repeat of a prepare still in flight replies
-- the wake again where the caller writes it (include/repeat_wake.lua: the first reply may have been lost).
-- Commands: seven on the common path (eight, with the wake, when nothing else of the topic is unchecked):
-- HGET inflight, HGET ended, HEXISTS dead_index, TIME, XADD, HSET, (EXISTS, ZADD unchecked) or ZADD due, and
-- ZADD schedule when it wakes the topic and KEYS[14] was passed.
--#include prepare_args

-- Idempotent: a retry after a lost reply finds the first half message (and replies the wake that reply carried).
local half_id = redis.call('HGET', inflight, txid)
if half_id then
  local pending_born = nil
  --#include repeat_wake
end
local prior = redis.call('HGET', ended, txid)
if prior then
  local state, _, prior_half = string.match(prior, '^([^|]+)|([^|]+)|([^|]+)')
  return {'OK', prior_half, state, 'DUPLICATE'}
end
if redis.call('HEXISTS', dead_index, txid) == 1 then
  return {'OK', '', 'DEAD', 'DUPLICATE'}
end

local born_ms
--#include born_ms
--#include half_fields
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
--#include wake_topic
