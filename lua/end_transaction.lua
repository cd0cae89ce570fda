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
-- One of the two calls of every send: no helper functions (see topic_keys.lua); the steps of apply_outcome and
-- retire in topic_lib.lua (which dead_resolve and the checker's scripts use) are written out here: keep them in
-- step. Nine commands on the common path: no TIME (the op record's id is the server's time) and no sweep of
-- expired outcomes but in one call of ten.

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

-- Outcome first, retire after: a write that fails part-way must not lose the half message.
-- COMMIT: the topic stream entry holds the fields a consumer in any language reads (README).
local committed_id = ''
if outcome == 'COMMIT' then
  local fields = {'transaction_id', txid, 'body', half['body']}
  if half['keys'] then fields[#fields + 1] = 'keys'; fields[#fields + 1] = half['keys'] end
  if half['tags'] then fields[#fields + 1] = 'tags'; fields[#fields + 1] = half['tags'] end
  if half['properties'] then fields[#fields + 1] = 'properties'; fields[#fields + 1] = half['properties'] end
  committed_id = redis.pcall('XADD', topic_stream, '*', unpack(fields))
  if type(committed_id) == 'table' then
    local err = tostring(committed_id['err'])
    if string.find(err, 'WRONGTYPE', 1, true) then
      return {'ERR', 'WRONGTYPE', 'the topic key ' .. topic_stream .. ' holds another type than a stream'}
    end
    return {'ERR', 'REFUSED', 'the topic stream refused the message: ' .. err}
  end
end
local op_id = redis.call('XADD', op_stream, 'MAXLEN', '~', op_maxlen, '*',
  'transaction_id', txid, 'outcome', outcome, 'half_id', half_id, 'committed_id', committed_id,
  'source', source, 'remark', remark)
-- Remember the outcome for the dedupe window, so a repeated end gets the first answer; in the calls whose time
-- ends in 0 ms (one in ten, by the server's clock) forget, in one batch, what has passed the window (topic_lib.lua's
-- expire_ended). The time stays text on the common path: a Lua number would go through printf and strtod.
if window_ms > 0 then
  local now = string.match(op_id, '^%d+')
  redis.call('HSET', ended, txid, outcome .. '|' .. (committed_id ~= '' and committed_id or '-') .. '|' .. half_id
    .. '|' .. group)
  redis.call('ZADD', ended_at, now, txid)
  if string.byte(now, -1) == 48 then
    local cutoff = string.format('%d', tonumber(now) - window_ms)
    local old = redis.call('ZRANGEBYSCORE', ended_at, '-inf', '(' .. cutoff, 'LIMIT', 0, 256)
    if #old > 0 then
      redis.call('HDEL', ended, unpack(old))
      redis.call('ZREM', ended_at, unpack(old))
      redis.call('HDEL', remarks, unpack(old))
    end
    redis.call('XTRIM', op_stream, 'MINID', cutoff)
  end
end

-- Retire the half message: memory follows in-flight transactions, not history. Still in `unchecked`, it was
-- never checked and has no `due`, `checks` or `requests` entry; its remark (if any) goes with its outcome when
-- the window passes. A pending check request lives in another hash slot: the caller deletes it.
redis.call('XDEL', half_stream, half_id)
redis.call('HDEL', inflight, txid)
local request_id = ''
if redis.call('ZREM', unchecked, txid) == 0 then
  redis.call('ZREM', due, txid)
  redis.call('HDEL', checks, txid)
  request_id = redis.call('HGET', requests, txid) or ''
  if request_id ~= '' then
    redis.call('HDEL', requests, txid)
  end
  redis.call('HDEL', remarks, txid)
elseif window_ms == 0 then
  redis.call('HDEL', remarks, txid)
end
return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
