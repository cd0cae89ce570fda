-- stream_advance: how far a reader gets in a stream with a budget of entries, without sending the entries.
-- Used by the Spark source to bound a micro-batch (maxEntriesPerTrigger) on the server side, one page per call:
-- the caller loops from the id returned, so that no call walks (and holds Redis for) more than 1000 entries.
-- KEYS[1] stream
-- ARGV[1] start     exclusive start entry id
-- ARGV[2] end       inclusive end entry id
-- ARGV[3] budget    at most this many entries, 1..1000 (a page)
-- Reply: {entries counted, id of the last one ('' when none)}

local page = 1000
local budget = tonumber(ARGV[3])
if not budget or budget < 1 or budget > page or budget ~= math.floor(budget) then
  return redis.error_reply('ERR stream_advance: budget must be an integer from 1 to ' .. page .. ', got ' .. tostring(ARGV[3]))
end
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], ARGV[2], 'COUNT', budget)
if #entries == 0 then
  return {0, ''}
end
return {#entries, entries[#entries][1]}
