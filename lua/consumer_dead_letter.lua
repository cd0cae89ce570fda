-- consumer_dead_letter: move one pending entry to the consumer group's dead-letter stream, with a reason.
-- KEYS: see consumer_keys.lua (topic_stream, dead_stream).
-- ARGV[1] group            consumer group
-- ARGV[2] entry_id         the pending entry
-- ARGV[3] reason           why (malformed entry, handler gave up, ...)
-- ARGV[4] delivery_count   deliveries so far, kept in the dead letter
-- Reply: 1 if moved, 0 if the entry was not pending (already acked or dead-lettered).

local group, entry_id, reason, deliveries = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if group == '' or entry_id == '' or reason == '' then
  return redis.error_reply('ERR consumer_dead_letter: group, entry_id and reason must not be empty')
end
local entries = redis.call('XRANGE', topic_stream, entry_id, entry_id)
local fields = entries[1] and entries[1][2] or {}
if dead_letter(group, entry_id, fields, reason, deliveries) then
  return 1
end
return 0
