-- Helpers of the transaction scripts that run off the send path (claim_checks, sweep_half, dead_resolve): the
-- loader (redis_txmq/scripts.py) puts this after topic_keys.lua. end_transaction.lua applies an outcome and
-- retires a half message with the same steps as apply_outcome and retire below, written out inline: keep them in
-- step.

-- Times come from the Redis server, never from a client: clients' clocks skew.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fail(code, detail)
  return {'ERR', code, detail}
end

local function to_map(flat)
  local map = {}
  for i = 1, #flat, 2 do
    map[flat[i]] = flat[i + 1]
  end
  return map
end

local function split_ended(value)
  local parts = {}
  for part in string.gmatch(value, '[^|]+') do
    parts[#parts + 1] = part
  end
  return parts[1], parts[2], parts[3], parts[4]
end

-- Forget ended transactions whose dedupe window has passed, at most `limit` of them, their remarks, and the op
-- records as old: once the window has passed, a finished transaction holds no memory. One end call in ten forgets
-- up to 256 (keeping up with the end rate in batches: a sweep per end would cost each end four more calls);
-- the checker's rounds forget the rest when traffic stops.
local function expire_ended(now, window_ms, limit)
  local cutoff = string.format('%d', now - window_ms)
  local old = redis.call('ZRANGEBYSCORE', ended_at, '-inf', '(' .. cutoff, 'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('HDEL', ended, unpack(old))
    redis.call('ZREM', ended_at, unpack(old))
    redis.call('HDEL', remarks, unpack(old))
  end
  if window_ms > 0 then
    redis.call('XTRIM', op_stream, 'MINID', cutoff)
  end
end

-- Drop every trace of an in-flight transaction: memory follows in-flight transactions, not history.
-- A transaction still in `unchecked` was never checked (claim_checks moves it to `due` when it counts a check),
-- so it has no `due`, `checks` or `requests` entry: the common path saves three calls. Its remark, if it has one,
-- goes with its outcome when the dedupe window expires (`keep_remark`), which saves the common path one more.
-- Returns the id of the transaction's pending check request ('' for none): it lives in another hash slot, so the
-- caller deletes it from its producer group's stream.
local function retire(txid, half_id, keep_remark)
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
    keep_remark = false
  end
  if not keep_remark then
    redis.call('HDEL', remarks, txid)
  end
  return request_id
end

-- The topic stream entry of a half message: the fields a consumer in any language reads (README).
local function committed_fields(half)
  local fields = {'transaction_id', half['transaction_id'], 'body', half['body']}
  for _, name in ipairs({'keys', 'tags', 'properties'}) do
    if half[name] then
      fields[#fields + 1] = name
      fields[#fields + 1] = half[name]
    end
  end
  return fields
end

-- Apply an outcome: on COMMIT append the message to the topic stream; in every case write the op record and
-- remember the outcome for the dedupe window. One call of the calling script: no crash can split these steps.
-- The time is the op record's id (the server's clock, as XADD reads it): no TIME call on the common path.
-- Returns the committed entry id ('' for ROLLBACK) and that time, or nil and an error reply when the topic key
-- holds another type (nothing written then).
local function apply_outcome(txid, outcome, half, half_id, source, remark, window_ms, op_maxlen)
  local committed_id = ''
  if outcome == 'COMMIT' then
    committed_id = redis.pcall('XADD', topic_stream, '*', unpack(committed_fields(half)))
    if type(committed_id) == 'table' then
      local err = tostring(committed_id['err'])
      if string.find(err, 'WRONGTYPE', 1, true) then
        return nil, fail('WRONGTYPE', 'the topic key ' .. topic_stream .. ' holds another type than a stream')
      end
      return nil, fail('REFUSED', 'the topic stream refused the message: ' .. err)
    end
  end
  local op_id = redis.call('XADD', op_stream, 'MAXLEN', '~', op_maxlen, '*',
    'transaction_id', txid, 'outcome', outcome, 'half_id', half_id, 'committed_id', committed_id,
    'source', source, 'remark', remark)
  local now = tonumber(string.match(op_id, '^%d+'))
  if window_ms > 0 then
    local committed = committed_id ~= '' and committed_id or '-'
    redis.call('HSET', ended, txid, outcome .. '|' .. committed .. '|' .. half_id .. '|' .. half['producer_group'])
    redis.call('ZADD', ended_at, now, txid)
    if now % 10 == 0 then
      expire_ended(now, window_ms, 256)
    end
  end
  return committed_id, now
end

-- Move a transaction, whole, to the dead-letter stream with why; nothing is dropped without a record.
-- `fields` is the half message's flat field list (as stored), kept unchanged in front of the dead_* fields.
-- Returns the dead-letter entry id and the id of the transaction's pending check request ('' for none).
local function bury(txid, half_id, fields, reason, check_times, now)
  local record = {}
  for i = 1, #fields do
    record[i] = fields[i]
  end
  local extra = {'dead_reason', reason, 'check_times', tostring(check_times), 'half_id', half_id,
                 'remark', redis.call('HGET', remarks, txid) or '', 'dead_at_ms', string.format('%d', now)}
  for i = 1, #extra do
    record[#record + 1] = extra[i]
  end
  local dead_id = redis.call('XADD', dead_stream, '*', unpack(record))
  if txid ~= '' then
    redis.call('HSET', dead_index, txid, dead_id)
  end
  return dead_id, retire(txid, half_id, false)
end

