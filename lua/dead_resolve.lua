-- dead_resolve: an operator's decision on a dead-lettered transaction: COMMIT, ROLLBACK or RECHECK.
-- COMMIT appends the message to the topic stream and writes the op record in this one call; RECHECK puts the
-- transaction back in flight (new half message, check count reset, due now). Idempotent like end_transaction.
-- COMMIT and ROLLBACK apply the outcome with the text end_transaction runs (lua/include/apply_outcome.lua).
-- KEYS: the topic keys of topic_keys.lua; with KEYS[14] (schedule), RECHECK wakes the topic there (its check is due
--       now); without it the caller does (Cluster: `ZADD txmq:schedule <wake> <topic stream>` after this call, with
--       the time the reply gives: a look that missed the recheck ran before it, so that score is at or after the
--       look's).
-- ARGV[1] transaction_id
-- ARGV[2] action             COMMIT | ROLLBACK | RECHECK
-- ARGV[3] dedupe_window_ms   a number from 0 to 2^53 (end_transaction.lua)
-- ARGV[4] op_stream_maxlen   a whole number from 1 to 2^53
-- ARGV[5] remark             '' for none
-- Reply: {'OK', state, half_id, committed_id or '', 'APPLIED' | 'DUPLICATE', ''} or {'ERR', code, detail}
--        (the last element is end_transaction's check request id: a dead-lettered transaction has none); an
--        applied RECHECK adds a seventh, wake: '' or, without KEYS[14], the time (ms) to wake the topic at.

local txid, action, window_ms, op_maxlen, remark = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if txid == '' or (action ~= 'COMMIT' and action ~= 'ROLLBACK' and action ~= 'RECHECK') then
  return fail('BADARG', 'need a transaction_id and an action of COMMIT, ROLLBACK or RECHECK')
end
--#include outcome_numbers
if numbers_refused then
  return fail('BADARG', numbers_refused)
end
local now = now_ms()

local dead_id = redis.call('HGET', dead_index, txid)
if not dead_id then
  local half_id = redis.call('HGET', inflight, txid)
  if half_id then
    if action == 'RECHECK' then
      return {'OK', 'PREPARED', half_id, '', 'DUPLICATE', ''}
    end
    return fail('NOT_DEAD', 'the transaction is in flight, not dead-lettered')
  end
  local prior = redis.call('HGET', ended, txid)
  if prior then
    local state, committed, prior_half = split_ended(prior)
    if state == action then
      return {'OK', state, prior_half, committed == '-' and '' or committed, 'DUPLICATE', ''}
    end
    return fail('CONFLICT', 'the transaction already ended with ' .. state)
  end
  return fail('NOT_FOUND', 'no dead-lettered transaction with this id')
end

local entries = redis.call('XRANGE', dead_stream, dead_id, dead_id)
if #entries == 0 then
  redis.call('HDEL', dead_index, txid)
  return fail('CORRUPT', 'dead letter ' .. dead_id .. ' is indexed but missing from the dead-letter stream')
end
local dead = to_map(entries[1][2])
if not dead['body'] or not dead['producer_group'] then
  return fail('CORRUPT', 'dead letter ' .. dead_id .. ' has no body or producer_group; inspect it with XRANGE')
end

if action == 'RECHECK' then
  redis.call('XDEL', dead_stream, dead_id)
  redis.call('HDEL', dead_index, txid)
  local fields = {}
  local dead_only = {dead_reason = true, check_times = true, half_id = true, remark = true, dead_at_ms = true,
                     born_ms = true}
  local flat = entries[1][2]
  for i = 1, #flat, 2 do
    if not dead_only[flat[i]] then
      fields[#fields + 1] = flat[i]
      fields[#fields + 1] = flat[i + 1]
    end
  end
  fields[#fields + 1] = 'born_ms'
  fields[#fields + 1] = string.format('%d', now)
  local half_id = redis.call('XADD', half_stream, '*', unpack(fields))
  redis.call('HSET', inflight, txid, half_id)
  redis.call('HDEL', checks, txid)
  redis.call('ZADD', due, now, txid)
  local wake = string.format('%d', now)
  if schedule then
    redis.call('ZADD', schedule, wake, topic_stream)
    wake = ''
  end
  if remark ~= '' then
    redis.call('HSET', remarks, txid, remark)
  end
  return {'OK', 'PREPARED', half_id, '', 'APPLIED', '', wake}
end

-- The dead letter stays when the topic stream refuses the message (the fragment returns the refusal), to be
-- resolved once the topic key is a stream again.
local half_id, outcome, half, source = dead['half_id'] or '-', action, dead, 'operator'
--#include apply_outcome
redis.call('XDEL', dead_stream, dead_id)
redis.call('HDEL', dead_index, txid)
return {'OK', action, half_id, committed_id, 'APPLIED', ''}
