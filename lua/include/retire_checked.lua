-- fragment retire_checked: drop the check-back's traces of a transaction that was checked (claim_checks moved it
-- from `unchecked` to `due`): its next check, its count, its pending check request, its remark. Inlined by the
-- loader (lua/README.md) into: include/retire_half.lua and end_transactions.lua.
-- Expects in scope: the topic keys (topic_keys.lua); txid; request_id (a local to set).
-- Sets: request_id, the id of the transaction's pending check request ('' for none): it lives in another hash slot,
--   so the caller deletes it from its producer group's stream.
-- Commands: ZREM, two HDEL, HGET, and HDEL of the request when there is one.
redis.call('ZREM', due, txid)
redis.call('HDEL', checks, txid)
request_id = redis.call('HGET', requests, txid) or ''
if request_id ~= '' then
  redis.call('HDEL', requests, txid)
end
redis.call('HDEL', remarks, txid)
