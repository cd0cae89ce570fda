-- open_stage: create a task attempt's stage of a write job, empty, with a time to live. The writer appends to it
-- with XADD NOMKSTREAM only, so once the job is settled (its stages deleted) a late write of a failed or cancelled
-- attempt appends nothing; a stage whose job is never settled (its driver and every checker gone) expires. It is
-- opened at id 0-1, so that the writer's entries can take the counted ids 1-<rows>, 2-<rows>, ... (entry number,
-- rows staged so far: lua/check_stage.lua): a repeated XADD of an entry (a retry after a lost reply) is refused.
-- KEYS[1] stage    stream  txmq:{<topic stream>}:stage:<job>:<attempt>
-- ARGV[1] ttl_ms   how long the stage may live: the job's max_age plus the dedupe window
-- Reply: {'OK'} or {'ERR', 'BADARG', detail}.

local ttl_ms = tonumber(ARGV[1])
if not ttl_ms or ttl_ms < 1 then
  return {'ERR', 'BADARG', 'ttl_ms must be >= 1'}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '0-1', 'opened', '1')
end
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return {'OK'}
