-- bury_half: move one in-flight transaction, whole, to the dead-letter stream with why (SPEC §4.6). The checker
-- calls it for a message of a transaction of several that it gave up on (claim_checks.lua) once that
-- transaction's record shows no decision and holds the message as dead-lettered (decide_transaction.lua, PIN).
-- KEYS: the topic keys of topic_keys.lua.
-- ARGV[1] transaction_id
-- ARGV[2] half_id        the half message given up on: a transaction ended or re-prepared meanwhile is left alone
-- ARGV[3] reason         kept in the dead letter
-- Reply: {'OK', dead_id or '', request_id or ''} (dead_id '' when the transaction is no longer that half message;
--        request_id: its pending check request, which the caller deletes) or {'ERR', 'BADARG', detail}.

local txid, expected_half, reason = ARGV[1], ARGV[2], ARGV[3]
if txid == '' or expected_half == '' or reason == '' then
  return fail('BADARG', 'transaction_id, half_id and reason must not be empty')
end
local half_id = redis.call('HGET', inflight, txid)
if half_id ~= expected_half then
  return {'OK', '', ''}
end
local entries = redis.call('XRANGE', half_stream, half_id, half_id)
local fields = entries[1] and entries[1][2] or {'transaction_id', txid}
local check_times = tonumber(redis.call('HGET', checks, txid) or '0') or 0
local dead_id, request_id = bury(txid, half_id, fields, reason, check_times, now_ms())
return {'OK', dead_id, request_id}
