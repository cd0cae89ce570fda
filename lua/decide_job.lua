-- decide_job: the decision of a write job (a Spark batch write, or one micro-batch of a streaming sink), written
-- once: the stages of the task attempts it commits, with the rows each holds, or ROLLBACK. For a micro-batch, the
-- sink's last committed batch id moves in the same call, so a micro-batch replayed after a restart (Spark re-runs
-- batches its checkpoint had not recorded) is recognised and not published twice. A COMMIT names only stages the
-- job still lists: a stage the checker set aside (its lease passed) cannot be committed, the call is refused and
-- nothing is decided. The decision ends the job's lease.
-- KEYS[1] record     hash   txmq:job:{<job>} or txmq:job:{<sink>}:<batch>: outcome, stages (JSON list), rows (JSON
--                           object: stage -> rows staged, '{}' when not given), decided_ms; lease_ms, started_ms
-- KEYS[2] stages     set    the job's stages (lua/note_stage.lua; same slot)
-- KEYS[3] sink       hash   txmq:sink:{<sink>}: last_batch (absent for a batch job)
-- ARGV[1] outcome    COMMIT | ROLLBACK
-- ARGV[2] stages     JSON list of the stage keys to publish (the committed task attempts' stages), '[]' for none
-- ARGV[3] keep_ms    how long the decision is kept
-- ARGV[4] batch_id   the micro-batch's id (decimal), '' for a batch job
-- ARGV[5] rows       JSON object: stage -> rows its attempt staged, '{}' when not known
-- ARGV[6] query_id   a micro-batch's streaming query ('' or absent: not known): a sink whose batches another query
--                    committed refuses it; a COMMIT records it in the sink beside last_batch
-- Reply: {'OK', outcome, stages, 'DECIDED' | 'DUPLICATE' | 'REPLAYED', rows, decided_ms} or {'ERR', code, detail}
--        with code BADARG, MISSING (a stage to commit is not the job's: nothing decided) or OTHER_QUERY (detail:
--        the query that committed the sink's batches; nothing decided).
--        DUPLICATE: the decision that stands (the first), with its stages; REPLAYED: the sink committed this batch
--        (or a later one) before and its decision is gone: nothing to publish (decided_ms '').

local outcome, stages, keep_ms, batch_id, rows = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5] or '{}'
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT or ROLLBACK, got ' .. outcome}
end
local ok, listed = pcall(cjson.decode, stages)
local rows_ok, counts = pcall(cjson.decode, rows)
if not keep_ms or keep_ms < 1 or string.sub(stages, 1, 1) ~= '[' or not ok or type(listed) ~= 'table'
  or string.sub(rows, 1, 1) ~= '{' or not rows_ok or type(counts) ~= 'table' then
  return {'ERR', 'BADARG', 'need keep_ms >= 1, a JSON list of stages and a JSON object of rows per stage'}
end
for i = 1, #listed do
  if type(listed[i]) ~= 'string' or listed[i] == '' then
    return {'ERR', 'BADARG', 'stage ' .. i .. ' is not a key'}
  end
end
local batch = nil
if batch_id ~= '' then
  batch = string.find(batch_id, '^%d+$') and tonumber(batch_id)
  if not batch or #KEYS < 3 then
    return {'ERR', 'BADARG', 'a micro-batch needs a whole batch id and the sink key'}
  end
end

local query_id = ARGV[6] or ''
if batch and query_id ~= '' then
  local owner = redis.call('HGET', KEYS[3], 'query_id')
  if owner and owner ~= query_id then
    return {'ERR', 'OTHER_QUERY', owner}
  end
end
local prior = redis.call('HMGET', KEYS[1], 'outcome', 'stages', 'rows', 'decided_ms')
if prior[1] then
  return {'OK', prior[1], prior[2] or '[]', 'DUPLICATE', prior[3] or '{}', prior[4] or ''}
end
if outcome == 'COMMIT' then
  for first = 1, #listed, 1000 do  -- in slices: unpack's stack has room for a few thousand values
    local last = math.min(first + 999, #listed)
    local member = redis.call('SMISMEMBER', KEYS[2], unpack(listed, first, last))
    for i = first, last do
      if member[i - first + 1] == 0 then
        return {'ERR', 'MISSING', 'stage ' .. listed[i] .. ' is not one of the job\'s stages (set aside when its ' ..
          'lease passed, or never opened)'}
      end
    end
  end
end
if batch and outcome == 'COMMIT' then
  local last = tonumber(redis.call('HGET', KEYS[3], 'last_batch') or '-1')
  if last >= batch then
    redis.call('HDEL', KEYS[1], 'lease_ms')
    return {'OK', 'COMMIT', '[]', 'REPLAYED', '{}', ''}
  end
  redis.call('HSET', KEYS[3], 'last_batch', batch_id)
  if query_id ~= '' then
    redis.call('HSET', KEYS[3], 'query_id', query_id)
  end
end
if outcome == 'ROLLBACK' then
  stages, rows = '[]', '{}'
end
local time = redis.call('TIME')
local decided_ms = time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3)
redis.call('HSET', KEYS[1], 'outcome', outcome, 'stages', stages, 'rows', rows, 'decided_ms', decided_ms)
redis.call('HDEL', KEYS[1], 'lease_ms')
redis.call('PEXPIRE', KEYS[1], keep_ms)
return {'OK', outcome, stages, 'DECIDED', rows, decided_ms}
