-- Prelude of the consumer scripts: the loader (redis_txmq/core/scripts.py) puts it in front of the script.
-- Every key is in the hash slot of the topic stream (hash tag {<topic stream key>}).
-- KEYS[1]  topic_stream   stream  committed messages, read through a consumer group
-- KEYS[2]  dead_stream    stream  entries this consumer group gave up on (redis_txmq.core.keys, consumer-dead:<group>)
-- KEYS[3]  leases         hash    consumer name -> the server time (ms) its lease on the entries it holds ends,
--                                 renewed by its heartbeat; 0: it stopped and handed them back (consumer-leases:<group>)

local topic_stream, dead_stream, leases = KEYS[1], KEYS[2], KEYS[3]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Ack the entry and copy it, whole, with why, to the dead-letter stream. Only an entry that is still pending
-- is moved, so running this twice writes one dead letter.
local function dead_letter(group, entry_id, fields, reason, delivery_count)
  if redis.call('XACK', topic_stream, group, entry_id) == 0 then
    return false
  end
  local record = {}
  for i = 1, #fields do
    record[i] = fields[i]
  end
  for _, pair in ipairs({{'dead_reason', reason}, {'dead_entry_id', entry_id}, {'dead_group', group},
                         {'dead_delivery_count', tostring(delivery_count)},
                         {'dead_at_ms', string.format('%d', now_ms())}}) do
    record[#record + 1] = pair[1]
    record[#record + 1] = pair[2]
  end
  redis.call('XADD', dead_stream, '*', unpack(record))
  return true
end

-- ===== end of prelude =====
