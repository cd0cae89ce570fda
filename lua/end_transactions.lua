-- end_transactions: apply the ends of many transactions of one topic partition in one call, each with exactly the
-- rules of end_transaction.lua (the fragment lua/include/end_one.lua, the same text), in order, each atomic with
-- the others (one script). What the asyncio lane sends when several ends to the same topic keys are in flight
-- together: one script invocation instead of one per end (redis_txmq/asyncio/lane.py).
-- KEYS: the topic keys of topic_keys.lua, those of every end of the call.
-- ARGV[1] width              the number of arguments of each end (8)
-- ARGV[2] ..                 the ends, `width` arguments each, each laid out as end_transaction's ARGV[1] .. [8]
-- Reply: one reply per end, in order: end_transaction's reply ({'OK', ...} or {'ERR', code, detail}), or the error
--        reply of a command that failed inside that end (the Lua error end_transaction would have raised: a
--        redis.call refused, e.g. out of memory); the ends before and after it still run. An error reply for the
--        whole call only for a malformed ARGV.
-- Every end is idempotent, so a batch sent twice (after a connection error) or holding the same end twice applies
-- each once. An end that fails part-way has written what end_transaction would have written before failing
-- (scripts do not roll back): out of memory refuses its first write, so nothing; a companion key of another type
-- (written over by another tool) fails a write after the topic entry, which is then published and the transaction
-- left in flight, so a repeat publishes it again (as end_transaction does; ruling it out would cost a TYPE per key).
-- No helper functions but one: the end runs in a function, made once per call (not per end), so that each of its
-- `return`s (apply_outcome's refused topic stream among them) ends that end only, and pcall keeps a failed command
-- to that end's reply.

local width = tonumber(ARGV[1])
if not width or width < 8 or width % 1 ~= 0 or (#ARGV - 1) % width ~= 0 then
  return redis.error_reply('ERR end_transactions: ARGV must be a width >= 8 then whole ends of that width, got '
    .. #ARGV .. ' arguments')
end

local function call_one(at)
  --#include end_one
end

--#include each_call
