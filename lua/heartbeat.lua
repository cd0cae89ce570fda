-- heartbeat: record that an instance (producer of a group, or checker) is alive, on the server's clock.
-- KEYS[1] instances   zset  instance id -> last heartbeat in ms
-- ARGV[1] instance    instance id
-- ARGV[2] live_ms     an instance is live if seen within this many ms; entries 10x older are removed
-- ARGV[3] action      'beat' or 'leave'
-- Reply: number of live instances after this call.

local instances, instance, live_ms, action = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
if instance == '' or not live_ms or live_ms <= 0 or (action ~= 'beat' and action ~= 'leave') then
  return redis.error_reply('ERR heartbeat: need an instance id, live_ms > 0 and action beat|leave')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if action == 'beat' then
  redis.call('ZADD', instances, now, instance)
else
  redis.call('ZREM', instances, instance)
end
redis.call('ZREMRANGEBYSCORE', instances, '-inf', '(' .. string.format('%d', now - 10 * live_ms))
return redis.call('ZCOUNT', instances, string.format('%d', now - live_ms), '+inf')
