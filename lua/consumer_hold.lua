-- consumer_hold: before a message goes to the handler, whether this consumer still holds its entry; if so, the
-- entry's idle time starts again. A handler is never called for an entry that another consumer took over (this
-- consumer's lease ran out, or a consumer of a release before leases claimed it by idle time), and min_idle_time
-- counts from the handler's start: such a consumer, or a lapse of the lease, cannot take it sooner.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream, leases).
-- ARGV[1] group      consumer group
-- ARGV[2] consumer   this consumer
-- ARGV[3] entry_id   the entry about to be handled
-- Reply: 1 if this consumer holds it (its idle time is now 0; its delivery count unchanged), 0 if it does not
-- (acked, dead-lettered or taken over). A missing stream or group fails with the NOGROUP error of XPENDING.

local group, consumer, entry_id = ARGV[1], ARGV[2], ARGV[3]
if group == '' or consumer == '' or entry_id == '' then
  return redis.error_reply('ERR consumer_hold: group, consumer and entry_id must not be empty')
end
local entry = redis.call('XPENDING', topic_stream, group, entry_id, entry_id, 1)[1]
if not entry or entry[2] ~= consumer then
  return 0
end
redis.call('XCLAIM', topic_stream, group, consumer, 0, entry_id, 'JUSTID')
return 1
