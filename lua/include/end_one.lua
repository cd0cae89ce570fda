-- fragment end_one: one end of a transaction, with every rule of lua/end_transaction.lua (SPEC §4.4): its arguments
-- checked, a repeat answered from the remembered outcome, the half message read and matched, then the outcome
-- applied (apply_outcome) and the half message retired (retire_half). Inlined by the loader (lua/README.md) into:
-- end_transaction.lua (one end per call, at the script's top level: no function) and end_transactions.lua (many
-- ends of one topic partition per call, in a function called once per end: each `return` is that end's reply).
-- Expects in scope: the topic keys (topic_keys.lua);
--   at   the offset of this end's arguments in ARGV: ARGV[at + 1] .. ARGV[at + 8] are end_transaction's
--        ARGV[1] .. ARGV[8] (transaction_id, producer_group, outcome, source, remark, dedupe_window_ms,
--        op_stream_maxlen, half_id)
-- Returns the end's reply (end_transaction.lua's header), from the script or the function it is inlined in; every
-- path returns.
-- Commands: nine on the common path (a COMMIT of a never-checked transaction), see apply_outcome and retire_half.
local txid, group, outcome, source, remark = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
local window_ms, op_maxlen, expected_half = tonumber(ARGV[at + 6]), tonumber(ARGV[at + 7]), ARGV[at + 8]
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

-- Outcome first, retire after: a write that fails part-way must not lose the half message. apply_outcome returns
-- this end's reply, having written nothing, when the topic stream refuses the message (from the script, or in
-- end_transactions.lua from the function that runs this end: the batch's other ends still apply).
--#include apply_outcome

-- A never-checked transaction's remark (if any) goes with its remembered outcome when the window passes.
local keep_remark = window_ms > 0
--#include retire_half
return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
