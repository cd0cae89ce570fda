-- stream_advance: how far a reader gets in a stream with a budget of entries, without sending the entries.
-- Used by the Spark source to bound a micro-batch (maxEntriesPerTrigger) on the server side.
-- KEYS[1] stream
-- ARGV[1] start     exclusive start entry id
-- ARGV[2] end       inclusive end entry id
-- ARGV[3] budget    at most this many entries
-- Reply: {entries counted, id of the last one ('' when none)}

local budget = tonumber(ARGV[3])
if not budget or budget < 1 then
  return redis.error_reply('ERR stream_advance: budget must be >= 1')
end
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], ARGV[2], 'COUNT', budget)
if #entries == 0 then
  return {0, ''}
end
return {#entries, entries[#entries][1]}
