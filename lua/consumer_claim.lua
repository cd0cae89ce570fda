-- consumer_claim: take over entries left pending by a dead consumer, and dead-letter those over the limit.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream).
-- ARGV[1] group            consumer group
-- ARGV[2] consumer         the consumer taking the entries over
-- ARGV[3] min_idle_ms      only entries idle at least this long are claimed
-- ARGV[4] cursor           XAUTOCLAIM cursor ('0-0' to start over)
-- ARGV[5] count            at most this many entries per call (keep <= 100: XAUTOCLAIM cost)
-- ARGV[6] max_deliveries   an entry delivered more often than this goes to dead_stream instead
-- Reply: {next_cursor, {entry_id, delivery_count, fields}, ...}: the claimed entries still to process.
-- A missing stream or group fails with the NOGROUP error of XAUTOCLAIM: the caller creates the group again.

local group, consumer, min_idle, cursor = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local count, max_deliveries = tonumber(ARGV[5]), tonumber(ARGV[6])
if not count or count < 1 or not max_deliveries or max_deliveries < 1 or not tonumber(min_idle) then
  return redis.error_reply('ERR consumer_claim: count, max_deliveries and min_idle_ms must be positive numbers')
end

local claimed = redis.call('XAUTOCLAIM', topic_stream, group, consumer, min_idle, cursor, 'COUNT', count)
local reply = {claimed[1]}
for _, entry in ipairs(claimed[2]) do
  local entry_id, fields = entry[1], entry[2]
  local pending = redis.call('XPENDING', topic_stream, group, entry_id, entry_id, 1)
  local deliveries = pending[1] and tonumber(pending[1][4]) or 1
  if deliveries > max_deliveries then
    dead_letter(group, entry_id, fields, 'delivery limit ' .. max_deliveries .. ' reached', deliveries)
  else
    reply[#reply + 1] = {entry_id, deliveries, fields}
  end
end
return reply
