-- schedule_topics: write what checkers saw of topics into their schedule (keys.SCHEDULE): when to look at each next.
-- A checker calls it after looking at topics (claim_checks.lua gives seen_ms and next_ms per topic stream). Safe
-- against what happened since the look: a score at or after seen_ms was written after it (a prepare woke the topic,
-- or another checker looked later), so it is only ever lowered, never raised or removed; an older score is the one
-- that made this look due, and is replaced (removed when the topic holds nothing to look at).
-- KEYS[1] schedule     zset  topic stream -> when (server ms) a checker looks at it next
-- ARGV    triples of   topic stream, seen_ms (the server time of the look), next_ms ('' for nothing to look at)
-- Reply: {'OK', number of topics scheduled, number removed} or {'ERR', 'BADARG', detail}.

local schedule = KEYS[1]
if #ARGV % 3 ~= 0 then
  return {'ERR', 'BADARG', 'ARGV must be triples of topic stream, seen_ms and next_ms'}
end
for i = 1, #ARGV, 3 do
  local seen, next_ms = tonumber(ARGV[i + 1]), ARGV[i + 2]
  if ARGV[i] == '' or not seen or (next_ms ~= '' and not tonumber(next_ms)) then
    return {'ERR', 'BADARG', 'need a topic stream, seen_ms and next_ms (a number or empty), got ' .. ARGV[i] .. ' '
      .. ARGV[i + 1] .. ' ' .. next_ms}
  end
end
local scheduled, removed = 0, 0
for i = 1, #ARGV, 3 do
  local stream, seen, next_ms = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local current = tonumber(redis.call('ZSCORE', schedule, stream))
  if current and current >= seen then
    if next_ms ~= '' and tonumber(next_ms) < current then
      redis.call('ZADD', schedule, next_ms, stream)
    end
    scheduled = scheduled + 1
  elseif next_ms ~= '' then
    redis.call('ZADD', schedule, next_ms, stream)
    scheduled = scheduled + 1
  else
    removed = removed + redis.call('ZREM', schedule, stream)
  end
end
return {'OK', scheduled, removed}
