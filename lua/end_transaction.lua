-- end_transaction: apply the outcome of a transaction, atomically and once (SPEC §4.4).
-- Called by the producer after its local transaction and by the checker with a check-back answer.
-- KEYS: the topic keys of topic_keys.lua.
-- ARGV[1] transaction_id
-- ARGV[2] producer_group     must match the half message's group (RocketMQ's checkPrepareMessage)
-- ARGV[3] outcome            COMMIT | ROLLBACK | UNKNOWN (UNKNOWN ends nothing; it only records the remark)
-- ARGV[4] source             who ends it: producer | checker | operator (kept in the op record)
-- ARGV[5] remark             free text, '' for none
-- ARGV[6] dedupe_window_ms   how long the outcome is remembered to answer a repeated end; 0 = not at all
-- ARGV[7] op_stream_maxlen   approximate cap of the op stream
-- ARGV[8] half_id            expected half message id, '' to skip that check
-- Reply: {'OK', state, half_id, committed_id or '', 'APPLIED' | 'DUPLICATE' | 'RECORDED', check_request_id or ''}
--        (check_request_id: the transaction's pending check request, retired with it; the caller deletes that
--        entry from its producer group's check-request stream)
--        or {'ERR', code, detail} with code BADARG | NOT_FOUND | CONFLICT | GROUP_MISMATCH | DEAD | CORRUPT | WRONGTYPE.
-- COMMIT appends to the topic stream and writes the op record in this one call: no crash can split them.

local txid, group, outcome, source, remark = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local window_ms, op_maxlen, expected_half = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
if txid == '' or group == '' then
  return fail('BADARG', 'transaction_id and producer_group must not be empty')
end
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' and outcome ~= 'UNKNOWN' then
  return fail('BADARG', 'outcome must be COMMIT, ROLLBACK or UNKNOWN, got ' .. outcome)
end
if not window_ms or window_ms < 0 or not op_maxlen or op_maxlen < 1 then
  return fail('BADARG', 'dedupe_window_ms must be >= 0 and op_stream_maxlen >= 1')
end

local now = now_ms()
expire_ended(now, window_ms, 16)

local half_id = redis.call('HGET', inflight, txid)
if not half_id then
  local prior = redis.call('HGET', ended, txid)
  if prior then
    local state, committed, prior_half, prior_group = split_ended(prior)
    if prior_group ~= group then
      return fail('GROUP_MISMATCH', 'the transaction belongs to producer group ' .. prior_group)
    end
    if outcome == 'UNKNOWN' or outcome == state then
      return {'OK', state, prior_half, committed == '-' and '' or committed, 'DUPLICATE', ''}
    end
    return fail('CONFLICT', 'the transaction already ended with ' .. state)
  end
  if redis.call('HEXISTS', dead_index, txid) == 1 then
    return fail('DEAD', 'the transaction is in the dead-letter stream')
  end
  return fail('NOT_FOUND', 'no in-flight transaction with this id (never prepared, or ended longer ago than the dedupe window)')
end
if expected_half ~= '' and expected_half ~= half_id then
  return fail('BADARG', 'the transaction has half message ' .. half_id .. ', not ' .. expected_half)
end

local entries = redis.call('XRANGE', half_stream, half_id, half_id)
if #entries == 0 then
  return fail('CORRUPT', 'half message ' .. half_id .. ' is indexed but missing from the half stream')
end
local half = to_map(entries[1][2])
if half['transaction_id'] ~= txid then
  return fail('CORRUPT', 'half message ' .. half_id .. ' belongs to transaction ' .. tostring(half['transaction_id']))
end
if half['producer_group'] ~= group then
  return fail('GROUP_MISMATCH', 'the half message belongs to producer group ' .. tostring(half['producer_group']))
end

if outcome == 'UNKNOWN' then
  if remark ~= '' then
    redis.call('HSET', remarks, txid, remark)
  end
  return {'OK', 'PREPARED', half_id, '', 'RECORDED', ''}
end

if outcome == 'COMMIT' and not is_stream_or_free(topic_stream) then
  return fail('WRONGTYPE', 'the topic key ' .. topic_stream .. ' holds another type than a stream')
end
-- Outcome first, retire after: a write that fails part-way must not lose the half message.
local committed_id = apply_outcome(txid, outcome, half, half_id, source, remark, now, window_ms, op_maxlen)
local request_id = retire(txid, half_id)
return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
