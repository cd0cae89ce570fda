-- heartbeat: record that an instance (producer of a group, or checker) is alive, on the server's clock, and the
-- durability level it writes with (for `txmq status`).
-- KEYS[1] instances   zset  instance id -> last heartbeat in ms
-- KEYS[2] levels      hash  instance id -> durability level (same hash slot as KEYS[1])
-- ARGV[1] instance    instance id
-- ARGV[2] live_ms     an instance is live if seen within this many ms; entries 10x older are removed, with their level
-- ARGV[3] action      'beat' or 'leave'
-- ARGV[4] level       the instance's durability level, as `txmq status` shows it ('' records none)
-- Reply: number of live instances after this call.

local instances, levels = KEYS[1], KEYS[2]
local instance, live_ms, action, level = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] or ''
if instance == '' or not live_ms or live_ms <= 0 or (action ~= 'beat' and action ~= 'leave') then
  return redis.error_reply('ERR heartbeat: need an instance id, live_ms > 0 and action beat|leave')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if action == 'beat' then
  redis.call('ZADD', instances, now, instance)
  if level ~= '' then
    redis.call('HSET', levels, instance, level)
  end
else
  redis.call('ZREM', instances, instance)
  redis.call('HDEL', levels, instance)
end
local gone_before = '(' .. string.format('%d', now - 10 * live_ms)
local gone = redis.call('ZRANGEBYSCORE', instances, '-inf', gone_before)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', instances, '-inf', gone_before)
  redis.call('HDEL', levels, unpack(gone))
end
return redis.call('ZCOUNT', instances, string.format('%d', now - live_ms), '+inf')
