-- fragment wake_topic: a new prepare's reply, having woken its topic in the checkers' schedule when it must (the
-- rule: prepare_one.lua's header): written here when the schedule key was passed (KEYS[14]), else the wake time is
-- in the reply for the caller to write (Cluster). Inlined by the loader (lua/README.md) into:
-- include/prepare_one.lua (prepare_half.lua) and prepare_halves.lua.
-- Expects in scope: the topic keys (topic_keys.lua: schedule, topic_stream); half_id;
--   wake  the time (ms, text) to score the topic at, or '' when it need not be woken.
-- Returns from the script (or the function it is inlined in) the prepare's reply. Commands: ZADD of the schedule.
if wake ~= '' and schedule then
  redis.call('ZADD', schedule, wake, topic_stream)
  wake = ''
end
return {'OK', half_id, 'PREPARED', 'NEW', wake}
