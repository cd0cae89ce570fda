-- due_topics: the topic streams the checkers' schedule (keys.SCHEDULE) says are due now, on the server's clock.
-- Read-only: a checker looks at them (claim_checks.lua) and writes what it saw back (schedule_topics.lua).
-- KEYS[1] schedule     zset  topic stream -> when (server ms) a checker looks at it next
-- ARGV[1] limit        at most this many, earliest first
-- Reply: {'OK', now_ms, {topic stream, ...}} or {'ERR', 'BADARG', detail}.

local schedule, limit = KEYS[1], tonumber(ARGV[1])
if not limit or limit < 1 then
  return {'ERR', 'BADARG', 'limit must be >= 1'}
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return {'OK', now, redis.call('ZRANGEBYSCORE', schedule, '-inf', now, 'LIMIT', 0, limit)}
