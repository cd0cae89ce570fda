-- consumer_claim: take over the pending entries of consumers that are gone, and dead-letter those over the limit.
-- An entry is taken over when its owner
--   - is the caller itself (an entry its handler failed on, or one it read and lost track of), once idle min_idle_ms;
--   - stopped and handed what it holds back (its lease is 0): at once;
--   - holds no live lease (its lease ran out: it died or froze; or it has none: a consumer of a release before
--     leases), once idle min_idle_ms.
-- The entries of a consumer whose lease is live are never touched, however long its handler takes.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream, leases).
-- ARGV[1] group            consumer group
-- ARGV[2] consumer         the consumer taking the entries over
-- ARGV[3] min_idle_ms      the idle time an entry needs before it is taken over (but from a consumer that left)
-- ARGV[4] cursor           the last pending entry id a walk looked at ('0-0' to start a walk)
-- ARGV[5] count            at most this many pending entries are looked at per call (keep <= 100)
-- ARGV[6] max_deliveries   an entry delivered more often than this goes to dead_stream instead
-- Reply: {next_cursor, {entry_id, delivery_count, fields}, ...}: the entries taken over, still to process;
-- next_cursor is '0-0' when the walk reached the end of the pending list.
-- A missing stream or group fails with the NOGROUP error of XPENDING: the caller creates the group again.

local group, consumer, cursor = ARGV[1], ARGV[2], ARGV[4]
local min_idle, count, max_deliveries = tonumber(ARGV[3]), tonumber(ARGV[5]), tonumber(ARGV[6])
if not count or count < 1 or not max_deliveries or max_deliveries < 1 or not min_idle or min_idle < 0 then
  return redis.error_reply('ERR consumer_claim: count, max_deliveries and min_idle_ms must be positive numbers')
end

local entries = redis.call('XPENDING', topic_stream, group, '(' .. cursor, '+', count)
local reply = {#entries < count and '0-0' or entries[#entries][1]}
local now = now_ms()
local lease_of = {[consumer] = -1}  -- the caller's own entries: by idle time only
local taken, deliveries = {}, {}
for _, entry in ipairs(entries) do
  local entry_id, owner, idle = entry[1], entry[2], tonumber(entry[3])
  local lease = lease_of[owner]
  if lease == nil then
    lease = tonumber(redis.call('HGET', leases, owner)) or -1
    lease_of[owner] = lease
  end
  if lease == 0 or (lease <= now and idle >= min_idle) then
    taken[#taken + 1] = entry_id
    deliveries[entry_id] = tonumber(entry[4]) + 1  -- XCLAIM counts this delivery
  end
end
if #taken == 0 then
  return reply
end
for _, claimed in ipairs(redis.call('XCLAIM', topic_stream, group, consumer, 0, unpack(taken))) do
  -- an entry deleted from the stream (trimmed) is dropped from the pending list by XCLAIM, and not returned
  if claimed then
    local entry_id, fields = claimed[1], claimed[2]
    if deliveries[entry_id] > max_deliveries then
      dead_letter(group, entry_id, fields, 'delivery limit ' .. max_deliveries .. ' reached', deliveries[entry_id])
    else
      reply[#reply + 1] = {entry_id, deliveries[entry_id], fields}
    end
  end
end
return reply
