-- forget_consumers: remove the consumers of a group that hold nothing and were not seen for a while: instances that
-- died, whose pending entries a live reader took over. Without it a group lists every instance that ever ran.
-- One script, so that no consumer can read between the check and its removal (XGROUP DELCONSUMER drops the entries
-- a consumer holds). A live consumer removed here (idle that long, holding nothing) is created again by its next read.
-- KEYS[1] stream    the stream the group reads
-- ARGV[1] group     consumer group
-- ARGV[2] me        the caller's consumer name, never removed
-- ARGV[3] idle_ms   only consumers idle at least this long are removed
-- Reply: the names removed.

local stream, group, me, idle_ms = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if not idle_ms or idle_ms < 0 then
  return redis.error_reply('ERR forget_consumers: idle_ms must be a number >= 0')
end
local removed = {}
local consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
if consumers['err'] then
  return removed  -- the stream or the group is gone (Redis lost its data): the caller's next read recreates it
end
for _, info in ipairs(consumers) do
  local fields = {}
  for i = 1, #info, 2 do
    fields[info[i]] = info[i + 1]
  end
  if fields['name'] ~= me and tonumber(fields['pending']) == 0 and tonumber(fields['idle']) >= idle_ms then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, fields['name'])
    removed[#removed + 1] = fields['name']
  end
end
return removed
