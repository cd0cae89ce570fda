-- fragment apply_outcome: apply the outcome of a transaction: publish it (publish_outcome.lua: on COMMIT its
-- message appended to the topic stream; in every case the op record) and remember it for the dedupe window. One
-- call of the including script: no crash can split these steps. Inlined by the loader (lua/README.md) into:
-- include/end_one.lua (the producer's and the checker's end: end_transaction.lua) and dead_resolve.lua (an
-- operator's decision on a dead letter); end_transactions.lua publishes each end's outcome with publish_outcome and
-- remembers them all after its ends.
-- The remembered time is the op record's id's, kept as text on the common path (a Lua number would go through printf
-- and strtod); in the calls whose time ends in 0 ms (one in ten) the outcomes past the window are forgotten in one
-- batch of up to 256 (expire_ended.lua).
-- Expects in scope: what publish_outcome.lua expects, and
--   window_ms   the dedupe window in ms, a number >= 0 (0: the outcome is not remembered)
--   half        with producer_group (kept in the remembered outcome)
-- Defines: committed_id, op_id (publish_outcome.lua).
-- Returns from the script what publish_outcome.lua returns (a refused topic stream, a replica), having written
-- nothing.
-- Commands: publish_outcome's, HSET and ZADD with a dedupe window.
--#include publish_outcome
if window_ms > 0 then
  local now = string.match(op_id, '^%d+')
  --#include outcome_record
  redis.call('HSET', ended, txid, record)
  redis.call('ZADD', ended_at, now, txid)
  if string.byte(now, -1) == 48 then
    local limit = 256
    --#include expire_ended
  end
end
