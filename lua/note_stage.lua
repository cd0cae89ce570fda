-- note_stage: list a task attempt's stage in its write job, unless the job is decided: a task that starts after
-- the driver committed or aborted (a late or speculative attempt) must write nothing the settling would miss.
-- KEYS[1] decision  hash  txmq:job:{<job>} or txmq:job:{<sink>}:<batch>
-- KEYS[2] stages    set   the job's stages (same slot)
-- ARGV[1] stage     the stage key (opened after this: open_stage.lua; a stage exists only once listed)
-- ARGV[2] keep_ms   how long the list is kept (as long as its stages: a job never settled leaves nothing for ever)
-- Reply: {'OK'}, {'DECIDED', outcome} (not listed: the writer deletes its stage) or {'ERR', 'BADARG', detail}.

local keep_ms = tonumber(ARGV[2] or '')
if ARGV[1] == nil or ARGV[1] == '' or not keep_ms or keep_ms < 1 then
  return {'ERR', 'BADARG', 'need the stage key and keep_ms >= 1'}
end
local outcome = redis.call('HGET', KEYS[1], 'outcome')
if outcome then
  return {'DECIDED', outcome}
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], keep_ms)
return {'OK'}
