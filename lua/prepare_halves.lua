-- prepare_halves: write the half messages of many new transactions of one topic partition in one call, each with
-- the rules of prepare_half.lua (lua/include/prepare_one.lua), in order, each atomic with the others (one script).
-- What the asyncio lane sends when several prepares to the same topic keys are in flight together
-- (redis_txmq/asyncio/lane.py).
-- KEYS: the topic keys of topic_keys.lua, those of every prepare of the call (schedule, KEYS[14], when passed).
-- ARGV[1] width              the number of arguments of each prepare (9, or 10 with parent_transaction_id)
-- ARGV[2] ..                 the prepares, `width` arguments each, each laid out as prepare_half's ARGV[1] .. [10];
--                            at most 2000 prepares
-- Reply: one reply per prepare, in order: prepare_half's reply ({'OK', ...} or {'ERR', code, detail}), or the error
--        reply of a command that failed inside that prepare (the Lua error prepare_half would have raised: a
--        redis.call refused); the prepares before and after it still run. An error reply for the whole call for a
--        malformed ARGV, and when the server is a replica (READONLY, MASTERDOWN: each_call.lua).
-- Cost: the indexes are read and written once per call, not once per prepare. Before the prepares, one HMGET each
-- of `inflight`, `ended` and `dead_index` (which transactions are in flight, ended or dead-lettered already); for
-- the first prepare that writes, one TIME (every half message of the call is born at that time) and one EXISTS of
-- `unchecked`; after them, one HSET of `inflight` and one ZADD of `unchecked` for all the half messages written.
-- In between, each prepare reads and updates local tables standing for those keys (`half_of`, `has_unchecked`,
-- `unchecked_born`), so a prepare sees every prepare before it in the call exactly as the second of two
-- prepare_half calls sees the first: a transaction prepared twice in one call is written once and answered
-- DUPLICATE the second time (with the wake a repeat replies, include/repeat_wake.lua), and only the first prepare
-- into an empty `unchecked` wakes the topic. What a prepare still does itself on the common
-- path: the XADD of its half message. The rest of the rules are prepare_one.lua's, line for line (its header says
-- how a prepare wakes the topic in the checkers' schedule); tests/test_batch_equivalence.py runs random calls
-- through this script and through prepare_half one by one and compares the replies and every key.
-- Every prepare is idempotent (a repeated transaction id is a DUPLICATE with the first half id), so a batch sent
-- twice (after a connection error) or holding the same transaction twice writes each half message once.
-- No helper functions but one: the prepare runs in a function, made once per call (not per prepare), so that each
-- of its `return`s ends that prepare only, and pcall keeps a failed command to that prepare's reply.

local batch_name, min_width = 'prepare_halves', 9
--#include batch_calls
-- `ended` or `dead_index` refusing its HMGET (another type, written over by another tool): each prepare that is not
-- a repeat of one in flight reads it itself, and fails, as alone
-- a prepare writes neither, so `ended_of` and `dead_of` are HMGET's replies, by the prepare's place in the call;
-- `half_of`, which the prepares write, by transaction id
local half_of, ended_of, dead_of = {}, nil, nil
do
  local in_flight = redis.call('HMGET', inflight, unpack(txids))
  local prior = redis.pcall('HMGET', ended, unpack(txids))
  local dead = redis.pcall('HMGET', dead_index, unpack(txids))
  ended_of = not prior['err'] and prior or nil
  dead_of = not dead['err'] and dead or nil
  for i = 1, #txids do
    half_of[txids[i]] = in_flight[i]
  end
end
-- the server's time, taken once for the call by the first prepare that writes: every half message of the call is
-- born at that time
local born_ms, has_unchecked = nil, nil
-- what the call writes after its prepares: the half messages indexed
local inflight_fields, unchecked_members, unchecked_born = {}, {}, {}
local inflight_calls, unchecked_calls = {}, {}

local function call_one(at)
  --#include prepare_args

  local half_id = half_of[txid]
  if half_id then
    local pending_born = unchecked_born[txid]
    --#include repeat_wake
  end
  local index = (at - 1) / width + 1  -- this prepare's place in the call and its replies
  local prior
  if ended_of then
    prior = ended_of[index]
  else
    prior = redis.call('HGET', ended, txid)
  end
  if prior then
    local state, _, prior_half = string.match(prior, '^([^|]+)|([^|]+)|([^|]+)')
    return {'OK', prior_half, state, 'DUPLICATE'}
  end
  if (dead_of and dead_of[index]) or (not dead_of and redis.call('HEXISTS', dead_index, txid) == 1) then
    return {'OK', '', 'DEAD', 'DUPLICATE'}
  end

  if not born_ms then
    --#include born_ms
  end
  --#include half_fields
  half_of[txid] = half_id
  inflight_fields[#inflight_fields + 1] = txid
  inflight_fields[#inflight_fields + 1] = half_id
  inflight_calls[#inflight_calls + 1] = index
  local wake = born_ms
  if immunity_ms then
    redis.call('ZADD', due, string.format('%d', tonumber(born_ms) + immunity_ms), txid)
  else
    if has_unchecked == nil then
      has_unchecked = redis.call('EXISTS', unchecked) == 1
    end
    if has_unchecked then
      wake = ''
    end
    unchecked_members[#unchecked_members + 1] = born_ms
    unchecked_members[#unchecked_members + 1] = txid
    unchecked_born[txid] = born_ms
    unchecked_calls[#unchecked_calls + 1] = index
    has_unchecked = true
  end
  --#include wake_topic
end

--#include each_call

-- The index writes after the prepares. A key of another type (written over by another tool) refuses its write, as
-- it would refuse each prepare's: the prepares whose write it was get that error as their reply, the others keep
-- theirs (a prepare with its own immunity, indexed in `due`, is not concerned by `unchecked`).
for _, write in ipairs({{'HSET', inflight, inflight_fields, inflight_calls},
                        {'ZADD', unchecked, unchecked_members, unchecked_calls}}) do
  if #write[3] > 0 then
    local refused = redis.pcall(write[1], write[2], unpack(write[3]))
    if type(refused) == 'table' and refused['err'] then
      for _, index in ipairs(write[4]) do
        replies[index] = refused
      end
    end
  end
end
return replies
