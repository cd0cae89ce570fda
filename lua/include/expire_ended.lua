-- fragment expire_ended: forget ended transactions whose dedupe window has passed, at most `limit` of them, their
-- remarks, and the op records as old: once the window has passed, a finished transaction holds no memory.
-- Inlined by the loader (lua/README.md) into: topic_lib.lua's expire_ended (the checker's rounds, claim_checks) and
-- apply_outcome.lua (one end in ten).
-- Expects in scope: the topic keys (topic_keys.lua: ended, ended_at, remarks, op_stream);
--   now        the server's time in ms, a number or its decimal text
--   window_ms  the dedupe window in ms, a number >= 0
--   limit      at most this many transactions are forgotten
-- Defines: cutoff (the oldest time still in the window, decimal text, 0 at the least), old (the transaction ids forgotten).
-- Commands: ZRANGEBYSCORE, three more when there is something to forget, XTRIM when there is a window.
-- never before 0: a window longer than the clock's time (about 57 years) made a cutoff XTRIM refuses, after an end
-- had published its message and before it retired it
local cutoff = string.format('%d', math.max(tonumber(now) - window_ms, 0))
local old = redis.call('ZRANGEBYSCORE', ended_at, '-inf', '(' .. cutoff, 'LIMIT', 0, limit)
if #old > 0 then
  redis.call('HDEL', ended, unpack(old))
  redis.call('ZREM', ended_at, unpack(old))
  redis.call('HDEL', remarks, unpack(old))
end
if window_ms > 0 then
  redis.call('XTRIM', op_stream, 'MINID', cutoff)
end
