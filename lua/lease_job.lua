-- lease_job: take or renew the lease of an undecided write job. A job is its driver's while its lease holds: the
-- task attempts that write for it renew the lease as they run, and the checker settles an undecided job only once
-- its lease has passed (a driver that died stops renewing). The job's record is created by the first lease.
-- KEYS[1] record    hash  txmq:job:{<job>} or txmq:job:{<sink>}:<batch>: lease_ms (the lease's end, server ms),
--                         started_ms; once decided: outcome, stages, rows, decided_ms (lua/decide_job.lua)
-- KEYS[2] stages    set   the job's stages (same slot; optional): kept as long as its stages while the job is leased
-- KEYS[3] sink      hash  txmq:sink:{<sink>} of a micro-batch (same slot; optional): query_id, the streaming query
--                         that committed its batches
-- ARGV[1] lease_ms  how long the lease lasts from now
-- ARGV[2] keep_ms   how long the record is kept past now
-- ARGV[3] list_ms   how long the stage list is kept past now (the stages' time to live; optional)
-- ARGV[4] query_id  the streaming query this micro-batch runs in ('' or absent: not known, not checked)
-- Reply: {'OK', lease end (ms)} (the end never moves earlier), {'DECIDED', outcome} (no lease: the job is
--        decided, an attempt writes nothing for it), {'ERR', 'OTHER_QUERY', the sink's query id} (the sink's batches
--        were committed by another streaming query: nothing leased) or {'ERR', 'BADARG', detail}.

local lease_ms, keep_ms, list_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3] or '1')
if not lease_ms or lease_ms < 1 or not keep_ms or keep_ms < 1 or not list_ms or list_ms < 1 then
  return {'ERR', 'BADARG', 'need lease_ms >= 1, keep_ms >= 1 and list_ms >= 1'}
end
if KEYS[3] and ARGV[4] and ARGV[4] ~= '' then
  local owner = redis.call('HGET', KEYS[3], 'query_id')
  if owner and owner ~= ARGV[4] then
    return {'ERR', 'OTHER_QUERY', owner}
  end
end
local record = redis.call('HMGET', KEYS[1], 'outcome', 'lease_ms', 'started_ms')
if record[1] then
  return {'DECIDED', record[1]}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ends = math.max(now + lease_ms, tonumber(record[2] or '0'))
redis.call('HSET', KEYS[1], 'lease_ms', string.format('%d', ends), 'started_ms', record[3] or string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], keep_ms)
if KEYS[2] and ARGV[3] then
  redis.call('PEXPIRE', KEYS[2], list_ms)
end
return {'OK', string.format('%d', ends)}
