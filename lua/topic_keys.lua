-- Prelude of every transaction script: the loader (redis_txmq/scripts.py) puts it in front of the script.
-- It binds KEYS, which the caller passes in the order of redis_txmq.keys.TopicKeys.script_keys(); every key is
-- in the hash slot of the topic stream (hash tag {<topic stream key>}), so these scripts also run on Cluster.
--
-- KEYS[1]  half_stream   stream  half messages of in-flight transactions
-- KEYS[2]  op_stream     stream  outcome records, capped
-- KEYS[3]  dead_stream   stream  transactions the checker gave up on
-- KEYS[4]  topic_stream  stream  committed messages: what consumers read
-- KEYS[5]  inflight      hash    transaction id -> half message id
-- KEYS[6]  ended         hash    transaction id -> "<state>|<committed id or ->|<half id>|<producer group>"
-- KEYS[7]  ended_at      zset    transaction id -> end time in ms, to forget `ended` after the dedupe window
-- KEYS[8]  unchecked     zset    transaction id -> born time in ms (no own immunity, never checked yet)
-- KEYS[9]  due           zset    transaction id -> time of the next check in ms
-- KEYS[10] checks        hash    transaction id -> number of checks so far
-- KEYS[11] remarks       hash    transaction id -> last remark
-- KEYS[12] dead_index    hash    transaction id -> entry id in dead_stream
-- KEYS[13] requests      hash    transaction id -> entry id of its pending check request (in its group's stream,
--                                another slot: the caller deletes the entry when a script returns its id)
--
-- Replies are tables: {'OK', ...} or {'ERR', code, detail}; the Python side maps codes to exceptions.

local half_stream, op_stream, dead_stream, topic_stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local inflight, ended, ended_at = KEYS[5], KEYS[6], KEYS[7]
local unchecked, due, checks, remarks, dead_index = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local requests = KEYS[13]

-- Times come from the Redis server, never from a client: clients' clocks skew.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function is_stream_or_free(key)
  local kind = redis.call('TYPE', key)
  kind = type(kind) == 'table' and kind['ok'] or kind
  return kind == 'stream' or kind == 'none'
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

-- Forget ended transactions whose dedupe window has passed, at most `limit` of them, and the op records as old:
-- once the window has passed, a finished transaction holds no memory. Each end call forgets a few (keeping up
-- with the end rate); the checker's rounds forget the rest when traffic stops.
local function expire_ended(now, window_ms, limit)
  local cutoff = string.format('%d', now - window_ms)
  local old = redis.call('ZRANGEBYSCORE', ended_at, '-inf', '(' .. cutoff, 'LIMIT', 0, limit)
  if #old > 0 then
    redis.call('HDEL', ended, unpack(old))
    redis.call('ZREM', ended_at, unpack(old))
  end
  if window_ms > 0 then
    redis.call('XTRIM', op_stream, 'MINID', cutoff)
  end
end

-- Drop every trace of an in-flight transaction: memory follows in-flight transactions, not history.
-- A transaction still in `unchecked` was never checked (claim_checks moves it to `due` when it counts a check),
-- so it has no `due`, `checks` or `requests` entry: the common path saves three calls.
-- Returns the id of the transaction's pending check request ('' for none): it lives in another hash slot, so the
-- caller deletes it from its producer group's stream.
local function retire(txid, half_id)
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
  end
  redis.call('HDEL', remarks, txid)
  return request_id
end

-- Remember an outcome for the dedupe window, so a repeated end gets the first answer.
local function remember_outcome(txid, state, committed_id, half_id, group, now, window_ms)
  if window_ms > 0 then
    local committed = committed_id ~= '' and committed_id or '-'
    redis.call('HSET', ended, txid, state .. '|' .. committed .. '|' .. half_id .. '|' .. group)
    redis.call('ZADD', ended_at, now, txid)
  end
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
-- Returns the committed entry id, or '' for ROLLBACK.
local function apply_outcome(txid, outcome, half, half_id, source, remark, now, window_ms, op_maxlen)
  local committed_id = ''
  if outcome == 'COMMIT' then
    committed_id = redis.call('XADD', topic_stream, '*', unpack(committed_fields(half)))
  end
  redis.call('XADD', op_stream, 'MAXLEN', '~', op_maxlen, '*',
    'transaction_id', txid, 'outcome', outcome, 'half_id', half_id, 'committed_id', committed_id,
    'source', source, 'remark', remark)
  remember_outcome(txid, outcome, committed_id, half_id, half['producer_group'], now, window_ms)
  return committed_id
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
  return dead_id, retire(txid, half_id)
end

-- ===== end of prelude =====
