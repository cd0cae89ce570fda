-- publish_stage: move the next rows of a committed write job's stage into its topic stream. Each call moves a
-- chunk of stage entries and trims them in the same atomic step, so calls can be repeated (by the driver, Spark's
-- abort, the checker after the driver died, a replayed micro-batch) and every row reaches the topic stream exactly
-- once. Every row of the chunk is checked before the first is appended (a row is a list of field names and values,
-- in pairs, each a string or a number, no name empty): a chunk holding a row that XADD would refuse moves nothing,
-- and stays. The rows moved are counted in the stage's published record, which outlives the stage: a stage
-- published in full is told apart from a missing one (expired, deleted, lost in a failover), and its count is
-- compared with the rows its attempt staged.
-- KEYS[1] stage          stream  txmq:{<topic stream>}:stage:<job>:<attempt>: entries of one field, 'rows', a
--                                MessagePack array of rows, each row a flat array of field names and values in the
--                                committed-entry format; an entry of other fields is one row itself
-- KEYS[2] topic_stream   stream  the topic stream (same hash slot)
-- KEYS[3] published      hash    txmq:{<topic stream>}:published:<job>:<attempt>: rows (moved so far)
-- ARGV[1] count          stage entries to move at most in this call
-- ARGV[2] keep_ms        how long the published record is kept (as long as the job's decision)
-- Reply: {'OK', rows moved, entries left, rows published in all} (the stage is deleted once empty) or
--        {'ERR', code, detail}, nothing moved, with code BADARG, MISSING (no stage, nothing published from it),
--        CORRUPT (an entry or a row that cannot be published: the stage stays as it is) or REFUSED (the topic
--        stream refused the first row: not a stream, out of memory).

local count, keep_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
if not count or count < 1 or not keep_ms or keep_ms < 1 then
  return {'ERR', 'BADARG', 'count and keep_ms must be >= 1'}
end

local function published(moved)
  local total = redis.call('HINCRBY', KEYS[3], 'rows', moved)
  redis.call('PEXPIRE', KEYS[3], keep_ms)
  return total
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  local total = redis.call('HGET', KEYS[3], 'rows')
  if not total then
    return {'ERR', 'MISSING', 'stage ' .. KEYS[1] .. ' is gone and none of its rows was published (expired, ' ..
      'deleted, or lost in a failover)'}
  end
  return {'OK', 0, 0, tonumber(total)}
end
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', count)
if #entries == 0 then
  redis.call('DEL', KEYS[1])
  return {'OK', 0, 0, published(0)}
end

local type = type
local function refused(row)
  if type(row) ~= 'table' then
    return 'is not a list'
  end
  local n = #row
  if n < 2 or n % 2 ~= 0 then
    return 'is not a list of field names and values in pairs'
  end
  for k = 1, n, 2 do
    local name, value = row[k], row[k + 1]
    local kind = type(name)
    if kind ~= 'string' and kind ~= 'number' then
      return 'has a ' .. kind .. ' at ' .. k .. ' (only strings and numbers can be published)'
    end
    if name == '' then
      return 'has an empty field name at ' .. k
    end
    kind = type(value)
    if kind ~= 'string' and kind ~= 'number' then
      return 'has a ' .. kind .. ' at ' .. (k + 1) .. ' (only strings and numbers can be published)'
    end
  end
  return nil
end

local rows, n_rows = {}, 0
for i = 1, #entries do
  local id, fields = entries[i][1], entries[i][2]
  if #fields == 2 and fields[1] == 'rows' then
    local ok, packed = pcall(cmsgpack.unpack, fields[2])
    if not ok or type(packed) ~= 'table' then
      return {'ERR', 'CORRUPT', 'stage entry ' .. id .. ' of ' .. KEYS[1] .. ' holds no MessagePack rows'}
    end
    for j = 1, #packed do
      local why = refused(packed[j])
      if why then
        return {'ERR', 'CORRUPT', 'stage entry ' .. id .. ' of ' .. KEYS[1] .. ': row ' .. j .. ' ' .. why}
      end
      n_rows = n_rows + 1
      rows[n_rows] = packed[j]
    end
  else
    local why = refused(fields)
    if why then
      return {'ERR', 'CORRUPT', 'stage entry ' .. id .. ' of ' .. KEYS[1] .. ' ' .. why}
    end
    n_rows = n_rows + 1
    rows[n_rows] = fields
  end
end
if n_rows > 0 then
  -- the first write of the call: refused (not a stream, out of memory), nothing is written; once it is in, Redis
  -- runs the rest of the script whatever the memory, and the rows checked above are all accepted
  local added = redis.pcall('XADD', KEYS[2], '*', unpack(rows[1]))
  if type(added) == 'table' and added['err'] then
    return {'ERR', 'REFUSED', 'the topic stream ' .. KEYS[2] .. ' refused a row: ' .. tostring(added['err'])}
  end
  local call, stream = redis.call, KEYS[2]
  for i = 2, n_rows do
    call('XADD', stream, '*', unpack(rows[i]))
  end
end
local last = entries[#entries][1]
local ms, seq = string.match(last, '^(%d+)-(%d+)$')
redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
local left = redis.call('XLEN', KEYS[1])
if left == 0 then
  redis.call('DEL', KEYS[1])
end
return {'OK', n_rows, left, published(n_rows)}
