-- forget_consumers: remove the consumers of a group that hold nothing and were not seen for a while: instances that
-- died, whose pending entries a live reader took over. Without it a group lists every instance that ever ran.
-- One script, so that no consumer can read between the check and its removal (XGROUP DELCONSUMER drops the entries
-- a consumer holds). A live consumer removed here (idle that long, holding nothing) is created again by its next read.
-- KEYS[1] stream    the stream the group reads
-- KEYS[2] leases    hash  consumer -> the server time (ms) its lease ends, 0: it stopped (consumer_keys.lua); optional
--                   (the groups of check requests and replies have none). With it, a consumer whose lease is live is
--                   kept, one that stopped (0) is removed however recently it was seen, and the lease of each consumer
--                   that holds nothing and is not live is dropped: the hash never outgrows the live consumers and
--                   those holding entries.
-- ARGV[1] group     consumer group
-- ARGV[2] me        the caller's consumer name, never removed
-- ARGV[3] idle_ms   only consumers idle at least this long are removed
-- Reply: the names removed.

local stream, leases, group, me, idle_ms = KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3])
if not idle_ms or idle_ms < 0 then
  return redis.error_reply('ERR forget_consumers: idle_ms must be a number >= 0')
end
local removed = {}
local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
if consumers['err'] then
  return removed  -- the stream or the group is gone (Redis lost its data): the caller's next read recreates it
end
local now, holding = 0, {}
if leases then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
for _, info in ipairs(consumers) do
  local fields = {}
  for i = 1, #info, 2 do
    fields[info[i]] = info[i + 1]
  end
  local name, lease = fields['name'], leases and tonumber(redis.call('HGET', leases, fields['name']))
  if tonumber(fields['pending']) > 0 then
    holding[name] = true
  elseif name ~= me and not (lease and lease > now) and (lease == 0 or tonumber(fields['idle']) >= idle_ms) then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    removed[#removed + 1] = name
  end
end
if leases then
  local records = redis.call('HGETALL', leases)
  for i = 1, #records, 2 do
    local lease = tonumber(records[i + 1])
    if records[i] ~= me and not holding[records[i]] and not (lease and lease > now) then
      redis.call('HDEL', leases, records[i])
    end
  end
end
return removed
