-- settle_job: what ends a write job other than its driver's COMMIT: the driver's abort, or the checker once the
-- job's lease has passed (its driver died or stopped renewing). A decision that stands is never changed: it is
-- returned, and the caller settles by it (a COMMIT is published, by the abort too). An undecided batch job is
-- decided ROLLBACK; an undecided micro-batch is decided nothing (Spark runs it again under the same id, which must
-- stay free to commit): its stages are moved to the set aside list, to be deleted, so a late COMMIT naming them is
-- refused (lua/decide_job.lua). The stage streams themselves (other hash slots) are deleted by the caller.
-- KEYS[1] record     hash  txmq:job:{<job>} or txmq:job:{<sink>}:<batch> (lua/lease_job.lua, lua/decide_job.lua)
-- KEYS[2] stages     set   the job's stages (same slot)
-- KEYS[3] set_aside  set   stages of a micro-batch that was not committed, to delete (same slot)
-- ARGV[1] mode       abort (the driver: an undecided job ends now) | expire (the checker: only once the lease
--                    passed, and a decision only once it is ARGV[5] old: its driver is settling it meanwhile)
-- ARGV[2] kind       batch | micro
-- ARGV[3] keep_ms    how long a decision (and the set aside list) is kept
-- ARGV[4] lease_ms   expire: the lease given to an undecided job found without one (listed by an older version)
-- ARGV[5] wait_ms    expire: how old a decision must be before the checker settles it
-- Reply: {status, outcome, stages (JSON list), rows (JSON object), ms} with status
--        DUPLICATE  a decision stands (ms: decided_ms): settle by it
--        DECIDED    a batch job was rolled back by this call (ms: decided_ms)
--        DISCARDED  a micro-batch's stages are set aside (also those of an earlier discard still to delete)
--        WAIT       expire: a decision stands, younger than ARGV[5] (ms: when it is due)
--        LEASED     expire: the lease holds (ms: its end)
--        GONE       nothing of the job is left
--        or {'ERR', 'BADARG', detail}.

local mode, kind, keep_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local lease_ms, wait_ms = tonumber(ARGV[4] or '0'), tonumber(ARGV[5] or '0')
if (mode ~= 'abort' and mode ~= 'expire') or (kind ~= 'batch' and kind ~= 'micro') or not keep_ms or keep_ms < 1
  or not lease_ms or lease_ms < 0 or not wait_ms or wait_ms < 0 then
  return {'ERR', 'BADARG', 'need mode abort|expire, kind batch|micro, keep_ms >= 1, lease_ms >= 0, wait_ms >= 0'}
end
local record = redis.call('HMGET', KEYS[1], 'outcome', 'stages', 'rows', 'decided_ms', 'lease_ms')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if record[1] then
  local decided = tonumber(record[4] or '0') or 0
  if mode == 'expire' and decided + wait_ms > now then
    return {'WAIT', record[1], record[2] or '[]', record[3] or '{}', string.format('%d', decided + wait_ms)}
  end
  return {'DUPLICATE', record[1], record[2] or '[]', record[3] or '{}', record[4] or ''}
end
local staged = redis.call('SMEMBERS', KEYS[2])
if mode == 'expire' then
  local lease = tonumber(record[5] or '')
  if lease and lease > now then
    return {'LEASED', '', '[]', '{}', string.format('%d', lease)}
  end
  if not lease then
    if #staged > 0 then  -- listed by an older version, which kept no lease: it gets one from now
      redis.call('HSET', KEYS[1], 'lease_ms', string.format('%d', now + lease_ms))
      redis.call('PEXPIRE', KEYS[1], keep_ms)
      return {'LEASED', '', '[]', '{}', string.format('%d', now + lease_ms)}
    end
    if kind == 'batch' or redis.call('EXISTS', KEYS[3]) == 0 then
      return {'GONE', '', '[]', '{}', ''}
    end
  end
end
if kind == 'batch' then
  redis.call('HSET', KEYS[1], 'outcome', 'ROLLBACK', 'stages', '[]', 'rows', '{}', 'decided_ms',
    string.format('%d', now))
  redis.call('HDEL', KEYS[1], 'lease_ms')
  redis.call('PEXPIRE', KEYS[1], keep_ms)
  return {'DECIDED', 'ROLLBACK', '[]', '{}', string.format('%d', now)}
end
redis.call('HDEL', KEYS[1], 'lease_ms', 'started_ms')
if #staged > 0 then
  for first = 1, #staged, 1000 do  -- in slices: unpack's stack has room for a few thousand values
    redis.call('SADD', KEYS[3], unpack(staged, first, math.min(first + 999, #staged)))
  end
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[3], keep_ms)
elseif redis.call('EXISTS', KEYS[3]) == 0 then
  return {'GONE', '', '[]', '{}', ''}
end
return {'DISCARDED', '', '[]', '{}', ''}
