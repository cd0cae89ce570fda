-- ensure_group: create a consumer group (and its stream) unless it exists, without an error reply.
-- KEYS[1] stream     the stream the group reads
-- ARGV[1] group      consumer group name
-- ARGV[2] start_id   where a new group starts ('0', '$' or an entry id)
-- Reply: 1 if the group was created, 0 if it existed; any other failure is raised.

local created = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
if type(created) == 'table' and created.err then
  if string.find(tostring(created.err), 'BUSYGROUP', 1, true) then
    return 0
  end
  return redis.error_reply(tostring(created.err))
end
return 1
