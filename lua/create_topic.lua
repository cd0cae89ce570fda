-- create_topic: fix the number of partitions of a topic, once (idempotent for the same number).
-- KEYS[1] topic_meta     hash   txmq:topic:{<topic>}: field 'partitions'
-- KEYS[2] topic_stream   stream the unpartitioned stream <topic> (same slot through the hash tag)
-- ARGV[1] partitions     1..1024
-- Reply: {'OK', partitions} or {'ERR', code, detail}.

local partitions = tonumber(ARGV[1])
if not partitions or partitions < 1 or partitions > 1024 or partitions % 1 ~= 0 then
  return {'ERR', 'BADARG', 'partitions must be a whole number from 1 to 1024, got ' .. ARGV[1]}
end
local existing = redis.call('HGET', KEYS[1], 'partitions')
if existing then
  if tonumber(existing) == partitions then
    return {'OK', partitions}
  end
  return {'ERR', 'EXISTS', 'the topic already has ' .. existing .. ' partitions'}
end
if partitions > 1 and redis.call('EXISTS', KEYS[2]) == 1 then
  return {'ERR', 'IN_USE', 'the topic already has messages in its unpartitioned stream'}
end
redis.call('HSET', KEYS[1], 'partitions', partitions)
return {'OK', partitions}
