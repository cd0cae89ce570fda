-- consumer_hand_back: a consumer that stops hands back what it holds. Its lease becomes 0, so that another consumer
-- takes its entries over at once (consumer_claim.lua) rather than after min_idle_time; and the entries it read but
-- never gave to its handler lose that delivery (their count goes back by one, their idle time is kept), so that a
-- hand-back never brings a message closer to max_deliveries.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream, leases).
-- ARGV[1]    group      consumer group
-- ARGV[2]    consumer   the consumer that stops
-- ARGV[3...] entry_id   entries it read and never gave to its handler (none: it only gives up its lease)
-- Reply: how many of those entries it still held (their delivery count went back).

local group, consumer = ARGV[1], ARGV[2]
if group == '' or consumer == '' then
  return redis.error_reply('ERR consumer_hand_back: group and consumer must not be empty')
end
redis.call('HSET', leases, consumer, '0')
local handed = 0
for i = 3, #ARGV do
  local found = redis.pcall('XPENDING', topic_stream, group, ARGV[i], ARGV[i], 1)
  if found['err'] then
    break  -- the stream or its group is gone (Redis lost its data): nothing is held
  end
  local entry = found[1]
  if entry and entry[2] == consumer then
    local count = math.max(tonumber(entry[4]) - 1, 0)
    redis.call('XCLAIM', topic_stream, group, consumer, 0, ARGV[i], 'IDLE', entry[3], 'RETRYCOUNT', count, 'JUSTID')
    handed = handed + 1
  end
end
return handed
