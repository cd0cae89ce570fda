-- publish_stage: move the next rows of a committed write job's stage into its topic stream. Each call moves a
-- chunk of stage entries and trims them in the same atomic step, so calls can be repeated (by the driver, or by
-- the checker after the driver died) and every row reaches the topic stream exactly once.
-- KEYS[1] stage          stream  txmq:{<topic stream>}:stage:<job>:<attempt>: entries of one field, 'rows', a
--                                MessagePack array of rows, each row a flat array of field names and values in the
--                                committed-entry format (strings only); an entry of other fields is one row itself
-- KEYS[2] topic_stream   stream  the topic stream (same hash slot)
-- ARGV[1] count          stage entries to move at most in this call
-- Reply: {'OK', rows moved, entries left} (the stage is deleted once empty) or {'ERR', code, detail}: nothing moved.
-- The rows are checked before the first is appended, and a topic key that is not a stream refuses the first one;
-- after that every row goes to the same stream.

local count = tonumber(ARGV[1])
if not count or count < 1 then
  return {'ERR', 'BADARG', 'count must be >= 1'}
end
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', count)
if #entries == 0 then
  redis.call('DEL', KEYS[1])
  return {'OK', 0, 0}
end
local rows = {}
for i = 1, #entries do
  local fields = entries[i][2]
  if #fields == 2 and fields[1] == 'rows' then
    local ok, packed = pcall(cmsgpack.unpack, fields[2])
    if not ok or type(packed) ~= 'table' then
      return {'ERR', 'CORRUPT', 'stage entry ' .. entries[i][1] .. ' of ' .. KEYS[1] .. ' holds no MessagePack rows'}
    end
    for j = 1, #packed do
      local row = packed[j]
      if type(row) ~= 'table' or #row < 2 or #row % 2 ~= 0 then
        return {'ERR', 'CORRUPT', 'stage entry ' .. entries[i][1] .. ' of ' .. KEYS[1] .. ': row ' .. j ..
          ' is not a list of field names and values'}
      end
      rows[#rows + 1] = row
    end
  else
    rows[#rows + 1] = fields
  end
end
if #rows > 0 then
  local added = redis.pcall('XADD', KEYS[2], '*', unpack(rows[1]))
  if type(added) == 'table' then
    return {'ERR', 'WRONGTYPE', 'the topic stream ' .. KEYS[2] .. ' refused a row: ' .. tostring(added['err'])}
  end
  for i = 2, #rows do
    redis.call('XADD', KEYS[2], '*', unpack(rows[i]))
  end
end
local last = entries[#entries][1]
local ms, seq = string.match(last, '^(%d+)-(%d+)$')
redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('DEL', KEYS[1])
end
return {'OK', #rows, left}
