-- check_stage: how many rows a write job's stage holds, checked before any row of the job is published (and
-- before a COMMIT is decided), and its time to live renewed (a live job's stages never expire). The writer gives
-- its stage entries counted ids, <entry number>-<rows staged so far> (1-100, 2-200, ...; the stage is opened at
-- 0-1, lua/open_stage.lua): a repeated XADD is refused, and the rows a stage holds are read from its last entry's
-- id in O(1), its entries counted by XLEN. A stage whose entries do not all have counted ids (an earlier writer's,
-- or another tool wrote into it) cannot be counted here: the caller compares the rows published with the rows
-- staged after publishing (lua/publish_stage.lua counts them).
-- KEYS[1] stage      stream  txmq:{<topic stream>}:stage:<job>:<attempt>
-- KEYS[2] published  hash    txmq:{<topic stream>}:published:<job>:<attempt>: rows (published so far)
-- ARGV[1] rows       the rows its attempt staged (decimal), '' when not known
-- ARGV[2] keep_ms    the stage's time to live from now (only renewed, never created)
-- Reply: {'OK', rows} (rows: staged in all, published ones included; '' when the stage cannot be counted),
--        {'ERR', 'MISSING', detail} (no stage, none of its rows published: expired, deleted, lost in a failover),
--        {'ERR', 'MISMATCH', detail} (it holds other rows than its attempt staged: an entry lost or repeated) or
--        {'ERR', 'BADARG', detail}.

local rows, keep_ms = ARGV[1], tonumber(ARGV[2] or '')
local expected = nil
if rows ~= '' then
  expected = string.find(rows or '', '^%d+$') and tonumber(rows)
end
if rows == nil or (rows ~= '' and not expected) or not keep_ms or keep_ms < 1 then
  return {'ERR', 'BADARG', 'need rows (a whole number, or empty) and keep_ms >= 1'}
end
local published = redis.call('HGET', KEYS[2], 'rows')

local function compared(total)
  if expected and total ~= expected then
    return {'ERR', 'MISMATCH', 'stage ' .. KEYS[1] .. ' holds ' .. total .. ' rows, its attempt staged ' .. expected}
  end
  return {'OK', total}
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  if not published then
    return {'ERR', 'MISSING', 'stage ' .. KEYS[1] .. ' is gone and none of its rows was published (expired, ' ..
      'deleted, or lost in a failover)'}
  end
  return compared(tonumber(published))
end
redis.call('PEXPIRE', KEYS[1], keep_ms)
local count = redis.call('XLEN', KEYS[1])
if count == 0 then
  return compared(tonumber(published or '0'))
end
local counted_below = 100000000000  -- no clock gives an id this small: a counted id
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1][1]
local number = tonumber(string.match(first, '^(%d+)-'))
if number >= counted_below then
  return {'OK', ''}
end
local last_number = number + count - 1
local tail = redis.call('XRANGE', KEYS[1], string.format('%d', last_number) .. '-0', '+', 'COUNT', 2)
for i = 1, #tail do
  if tonumber(string.match(tail[i][1], '^(%d+)-')) >= counted_below then
    return {'OK', ''}  -- another tool appended an entry of its own: not countable here
  end
end
local found, total = nil, nil
if #tail >= 1 then
  found, total = string.match(tail[1][1], '^(%d+)-(%d+)$')
  found, total = tonumber(found), tonumber(total)
end
if #tail ~= 1 or found ~= last_number or (not published and number ~= 1) then
  return {'ERR', 'MISMATCH', 'stage ' .. KEYS[1] .. ' holds ' .. count .. ' entries, not entries ' .. number ..
    ' to ' .. last_number .. ': an entry is lost or was written twice'}
end
return compared(total)
