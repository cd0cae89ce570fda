-- decide_job: the decision of a write job (a Spark batch write, or one micro-batch of a streaming sink), written
-- once: the stages of the task attempts it commits, or ROLLBACK. For a micro-batch, the sink's last committed
-- batch id moves in the same call, so a micro-batch replayed after a restart (Spark re-runs batches its
-- checkpoint had not recorded) is recognised and not published twice.
-- KEYS[1] decision   hash   txmq:job:{<job>} or txmq:job:{<sink>}:<batch>: outcome, stages (JSON list), decided_ms
-- KEYS[2] sink       hash   txmq:sink:{<sink>}: last_batch (absent for a batch job)
-- ARGV[1] outcome    COMMIT | ROLLBACK
-- ARGV[2] stages     JSON list of the stage keys to publish (the committed task attempts' stages), '[]' for none
-- ARGV[3] keep_ms    how long the decision is kept
-- ARGV[4] batch_id   the micro-batch's id (decimal), '' for a batch job
-- Reply: {'OK', outcome, stages, 'DECIDED' | 'DUPLICATE' | 'REPLAYED'} or {'ERR', 'BADARG', detail}
--        DUPLICATE: the decision that stands (the first), with its stages; REPLAYED: the sink committed this batch
--        (or a later one) before and its decision is gone: nothing to publish.

local outcome, stages, keep_ms, batch_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT or ROLLBACK, got ' .. outcome}
end
if not keep_ms or keep_ms < 1 or string.sub(stages, 1, 1) ~= '[' then
  return {'ERR', 'BADARG', 'need keep_ms >= 1 and a JSON list of stages'}
end
local batch = nil
if batch_id ~= '' then
  batch = string.find(batch_id, '^%d+$') and tonumber(batch_id)
  if not batch or #KEYS < 2 then
    return {'ERR', 'BADARG', 'a micro-batch needs a whole batch id and the sink key'}
  end
end

local prior = redis.call('HMGET', KEYS[1], 'outcome', 'stages')
if prior[1] then
  return {'OK', prior[1], prior[2] or '[]', 'DUPLICATE'}
end
if batch and outcome == 'COMMIT' then
  local last = tonumber(redis.call('HGET', KEYS[2], 'last_batch') or '-1')
  if last >= batch then
    return {'OK', 'COMMIT', '[]', 'REPLAYED'}
  end
  redis.call('HSET', KEYS[2], 'last_batch', batch_id)
end
if outcome == 'ROLLBACK' then
  stages = '[]'
end
local time = redis.call('TIME')
redis.call('HSET', KEYS[1], 'outcome', outcome, 'stages', stages,
  'decided_ms', time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3))
redis.call('PEXPIRE', KEYS[1], keep_ms)
return {'OK', outcome, stages, 'DECIDED'}
