-- heartbeat: record that an instance (producer of a group, or checker) is alive, on the server's clock, the
-- durability level it writes with (for `txmq status`) and, when given KEYS[3], the key layout version it writes.
-- KEYS[1] instances   zset  instance id -> last heartbeat in ms
-- KEYS[2] levels      hash  instance id -> durability level (same hash slot as KEYS[1])
-- KEYS[3] layouts     hash  instance id -> key layout version (same hash slot as KEYS[1]); optional: a caller that
--                           records no layout (a checker; release 0.1.0, which knew no layouts) passes two keys
-- ARGV[1] instance    instance id
-- ARGV[2] live_ms     an instance is live if seen within this many ms; entries 10x older are removed, with their
--                     level and layout record
-- ARGV[3] action      'beat' or 'leave'
-- ARGV[4] level       the instance's durability level, as `txmq status` shows it ('' records none)
-- ARGV[5] layout      the key layout version the instance writes, a positive integer (with KEYS[3] only)
-- With KEYS[3], a layout record whose instance is not in KEYS[1] any more (dropped by a caller without KEYS[3]) is
-- removed whenever the hash holds more records than KEYS[1] has instances: it never outgrows the zset for long.
-- Reply: number of live instances after this call.

local instances, levels, layouts = KEYS[1], KEYS[2], KEYS[3]
local instance, live_ms, action, level = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] or ''
if instance == '' or not live_ms or live_ms <= 0 or (action ~= 'beat' and action ~= 'leave') then
  return redis.error_reply('ERR heartbeat: need an instance id, live_ms > 0 and action beat|leave')
end
local layout = ARGV[5]
if layouts and not (layout and string.match(layout, '^[1-9][0-9]*$')) then
  return redis.error_reply('ERR heartbeat: with a layouts key (KEYS[3]), need a layout version > 0 (ARGV[5])')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if action == 'beat' then
  redis.call('ZADD', instances, now, instance)
  if level ~= '' then
    redis.call('HSET', levels, instance, level)
  end
  if layouts then
    redis.call('HSET', layouts, instance, layout)
  end
else
  redis.call('ZREM', instances, instance)
  redis.call('HDEL', levels, instance)
  if layouts then
    redis.call('HDEL', layouts, instance)
  end
end
local gone_before = '(' .. string.format('%d', now - 10 * live_ms)
local gone = redis.call('ZRANGEBYSCORE', instances, '-inf', gone_before)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', instances, '-inf', gone_before)
  redis.call('HDEL', levels, unpack(gone))
  if layouts then
    redis.call('HDEL', layouts, unpack(gone))
  end
end
if layouts and redis.call('HLEN', layouts) > redis.call('ZCARD', instances) then
  for _, recorded in ipairs(redis.call('HKEYS', layouts)) do
    if not redis.call('ZSCORE', instances, recorded) then
      redis.call('HDEL', layouts, recorded)
    end
  end
end
return redis.call('ZCOUNT', instances, string.format('%d', now - live_ms), '+inf')
