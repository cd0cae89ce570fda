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
-- One of the two calls of every send: no helper functions (see topic_keys.lua). Applying the outcome and retiring
-- the half message are the fragments lua/include/apply_outcome.lua and retire_half.lua, inlined by the loader
-- (lua/README.md), the same text dead_resolve and topic_lib's retire (the checker's burials) run. Nine commands on
-- the common path: no TIME (the op record's id is the server's time) and no sweep of expired outcomes but in one
-- call of ten.

local txid, group, outcome, source, remark = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local window_ms, op_maxlen, expected_half = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
if txid == '' or group == '' then
  return {'ERR', 'BADARG', 'transaction_id and producer_group must not be empty'}
end
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' and outcome ~= 'UNKNOWN' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT, ROLLBACK or UNKNOWN, got ' .. outcome}
end
if not window_ms or window_ms < 0 or not op_maxlen or op_maxlen < 1 then
  return {'ERR', 'BADARG', 'dedupe_window_ms must be >= 0 and op_stream_maxlen >= 1'}
end

local half_id = redis.call('HGET', inflight, txid)
if not half_id then
  local prior = redis.call('HGET', ended, txid)
  if prior then
    local state, committed, prior_half, prior_group = string.match(prior, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)')
    if prior_group ~= group then
      return {'ERR', 'GROUP_MISMATCH', 'the transaction belongs to producer group ' .. tostring(prior_group)}
    end
    if outcome == 'UNKNOWN' or outcome == state then
      return {'OK', state, prior_half, committed == '-' and '' or committed, 'DUPLICATE', ''}
    end
    return {'ERR', 'CONFLICT', 'the transaction already ended with ' .. state}
  end
  if redis.call('HEXISTS', dead_index, txid) == 1 then
    return {'ERR', 'DEAD', 'the transaction is in the dead-letter stream'}
  end
  return {'ERR', 'NOT_FOUND',
          'no in-flight transaction with this id (never prepared, or ended longer ago than the dedupe window)'}
end
if expected_half ~= '' and expected_half ~= half_id then
  return {'ERR', 'BADARG', 'the transaction has half message ' .. half_id .. ', not ' .. expected_half}
end

local entries = redis.call('XRANGE', half_stream, half_id, half_id)
if #entries == 0 then
  return {'ERR', 'CORRUPT', 'half message ' .. half_id .. ' is indexed but missing from the half stream'}
end
local flat = entries[1][2]
local half = {}
for i = 1, #flat, 2 do
  half[flat[i]] = flat[i + 1]
end
if half['transaction_id'] ~= txid then
  return {'ERR', 'CORRUPT', 'half message ' .. half_id .. ' belongs to transaction ' .. tostring(half['transaction_id'])}
end
if half['producer_group'] ~= group then
  return {'ERR', 'GROUP_MISMATCH', 'the half message belongs to producer group ' .. tostring(half['producer_group'])}
end

if outcome == 'UNKNOWN' then
  if remark ~= '' then
    redis.call('HSET', remarks, txid, remark)
  end
  return {'OK', 'PREPARED', half_id, '', 'RECORDED', ''}
end

-- Outcome first, retire after: a write that fails part-way must not lose the half message. The fragment returns
-- from the script, having written nothing, when the topic stream refuses the message.
--#include apply_outcome

-- A never-checked transaction's remark (if any) goes with its remembered outcome when the window passes.
local keep_remark = window_ms > 0
--#include retire_half
return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
