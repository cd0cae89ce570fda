-- Helpers of the transaction scripts that run off the send path (claim_checks, sweep_half, bury_half,
-- dead_resolve): the loader (redis_txmq/core/scripts.py) puts this after topic_keys.lua. The steps the send path shares
-- with them are fragments in lua/include/, inlined as text (lua/README.md): end_transaction runs the same
-- retire_half and expire_ended with no function around them.

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

-- One end call in ten forgets up to 256 (keeping up with the end rate in batches: a sweep per end would cost each
-- end four more calls); the checker's rounds forget the rest when traffic stops (lua/include/expire_ended.lua).
local function expire_ended(now, window_ms, limit)
  --#include expire_ended
end

-- Returns the id of the transaction's pending check request ('' for none; lua/include/retire_half.lua).
local function retire(txid, half_id, keep_remark)
  --#include retire_half
  return request_id
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

