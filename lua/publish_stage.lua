-- publish_stage: move the next rows of a committed write job's stage into its topic stream. Each call moves a
-- chunk and trims what it moved in the same atomic step, so calls can be repeated (by the driver, or by the
-- checker after the driver died) and every row reaches the topic stream exactly once.
-- KEYS[1] stage          stream  txmq:{<topic stream>}:stage:<job>:<attempt>: the rows, in the committed-entry format
-- KEYS[2] topic_stream   stream  the topic stream (same hash slot)
-- ARGV[1] count          rows to move at most in this call
-- Reply: {'OK', moved, left} (the stage is deleted once empty) or {'ERR', code, detail}.

local count = tonumber(ARGV[1])
if not count or count < 1 then
  return {'ERR', 'BADARG', 'count must be >= 1'}
end
local rows = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', count)
if #rows == 0 then
  redis.call('DEL', KEYS[1])
  return {'OK', 0, 0}
end
for i = 1, #rows do
  local added = redis.pcall('XADD', KEYS[2], '*', unpack(rows[i][2]))
  if type(added) == 'table' then
    if i > 1 then
      redis.call('XTRIM', KEYS[1], 'MINID', rows[i][1])
    end
    return {'ERR', 'WRONGTYPE', 'the topic stream ' .. KEYS[2] .. ' refused a row: ' .. tostring(added['err'])}
  end
end
local last = rows[#rows][1]
local ms, seq = string.match(last, '^(%d+)-(%d+)$')
redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('DEL', KEYS[1])
end
return {'OK', #rows, left}
