-- consumer_heartbeat: take or renew a consumer's lease on the entries it holds, and say whether other consumers
-- hold entries without a live lease (they stopped or died): a claim walk is worth making now, not at its next turn.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream, leases).
-- ARGV[1] group      consumer group
-- ARGV[2] consumer   the consumer whose lease this is
-- ARGV[3] lease_ms   the lease lasts this long from now (a few heartbeat intervals)
-- ARGV[4] mode       'acquire' (the consumer starts, or reads again after it stopped) or 'renew' (its heartbeat,
--                    which leaves a lease that was handed back (0) as it is: a beat that lands after the
--                    hand-back takes nothing back)
-- Reply: how many other consumers hold pending entries without a live lease; -1 when a renew found the lease handed
-- back (nothing changed).

local group, consumer, lease_ms, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if group == '' or consumer == '' or not lease_ms or lease_ms <= 0 or (mode ~= 'acquire' and mode ~= 'renew') then
  return redis.error_reply('ERR consumer_heartbeat: need a group, a consumer, lease_ms > 0 and mode acquire|renew')
end
if mode == 'renew' and redis.call('HGET', leases, consumer) == '0' then
  return -1
end
local now = now_ms()
redis.call('HSET', leases, consumer, string.format('%d', now + lease_ms))
local summary = redis.pcall('XPENDING', topic_stream, group)
if summary['err'] or not summary[4] then
  return 0  -- nothing pending, or no group yet (or any more: the consumer's next read creates it again)
end
local orphaned = 0
for _, holder in ipairs(summary[4]) do
  if holder[1] ~= consumer then
    local lease = tonumber(redis.call('HGET', leases, holder[1]))
    if not lease or lease <= now then
      orphaned = orphaned + 1
    end
  end
end
return orphaned
