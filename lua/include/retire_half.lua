-- fragment retire_half: drop every trace of an in-flight transaction: memory follows in-flight transactions, not
-- history. Inlined by the loader (lua/README.md) into: include/end_one.lua (the send path's end:
-- end_transaction.lua and the batch end_transactions.lua) and topic_lib.lua's retire (bury: claim_checks,
-- sweep_half, bury_half).
-- A transaction still in `unchecked` was never checked (claim_checks moves it to `due` when it counts a check), so
-- it has no `due`, `checks` or `requests` entry: the common path saves three calls. Its remark, if it has one, goes
-- with its outcome when the dedupe window expires (`keep_remark`), which saves the common path one more.
-- Expects in scope: the topic keys (topic_keys.lua);
--   txid         the transaction id
--   half_id      its half message's entry id in half_stream
--   keep_remark  true: a never-checked transaction's remark stays (forgotten with its remembered outcome)
-- Defines: request_id, the id of the transaction's pending check request ('' for none): it lives in another hash
--   slot, so the caller deletes it from its producer group's stream.
-- Commands: three on the common path (XDEL, HDEL, ZREM), up to five more for a transaction that was checked.
redis.call('XDEL', half_stream, half_id)
redis.call('HDEL', inflight, txid)
local request_id = ''
if redis.call('ZREM', unchecked, txid) == 0 then
  --#include retire_checked
elseif not keep_remark then
  redis.call('HDEL', remarks, txid)
end
