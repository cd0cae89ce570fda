-- prepare_halves: write the half messages of many new transactions of one topic partition in one call, each with
-- exactly the rules of prepare_half.lua (the fragment lua/include/prepare_one.lua, the same text), in order, each
-- atomic with the others (one script). What the asyncio lane sends when several prepares to the same topic keys
-- are in flight together: one script invocation instead of one per prepare (redis_txmq/asyncio/lane.py).
-- KEYS: the topic keys of topic_keys.lua, those of every prepare of the call (schedule, KEYS[14], when passed).
-- ARGV[1] width              the number of arguments of each prepare (9, or 10 with parent_transaction_id)
-- ARGV[2] ..                 the prepares, `width` arguments each, each laid out as prepare_half's ARGV[1] .. [10]
-- Reply: one reply per prepare, in order: prepare_half's reply ({'OK', ...} or {'ERR', code, detail}), or the error
--        reply of a command that failed inside that prepare (the Lua error prepare_half would have raised: a
--        redis.call refused); the prepares before and after it still run. An error reply for the whole call only
--        for a malformed ARGV.
-- Wake: each prepare wakes the topic as prepare_half would, in turn: the first into an empty `unchecked` (and any
-- with its own immunity) writes the schedule (or replies its wake time when KEYS[14] is not passed); the ones after
-- it find `unchecked` non-empty and do not, which is correct: the first one's score covers them (prepare_one.lua).
-- Every prepare is idempotent (a repeated transaction id is a DUPLICATE with the first half id), so a batch sent
-- twice (after a connection error) or holding the same transaction twice writes each half message once.
-- No helper functions but one: the prepare runs in a function, made once per call (not per prepare), so that each
-- of its `return`s ends that prepare only, and pcall keeps a failed command to that prepare's reply.

local width = tonumber(ARGV[1])
if not width or width < 9 or width % 1 ~= 0 or (#ARGV - 1) % width ~= 0 then
  return redis.error_reply('ERR prepare_halves: ARGV must be a width >= 9 then whole prepares of that width, got '
    .. #ARGV .. ' arguments')
end

local function call_one(at)
  --#include prepare_one
end

--#include each_call
