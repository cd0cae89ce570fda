-- fragment half_fields: a half message written to the half stream: what the prepare was given, its birth time, and
-- the fields it has only when set. Inlined by the loader (lua/README.md) into: include/prepare_one.lua
-- (prepare_half.lua) and prepare_halves.lua.
-- Expects in scope: the topic keys (topic_keys.lua: half_stream); at, width (prepare_one.lua); txid, group, topic,
--   partition, immunity_ms (prepare_args.lua);
--   born_ms  the server's TIME in ms, as text (born_ms.lua): once per call in prepare_halves.lua;
--   half_id  a local to set.
-- Sets: half_id, the half message's id. Commands: XADD of the half message.
local parent = width >= 10 and ARGV[at + 10] or ''
if ARGV[at + 6] == '' and ARGV[at + 7] == '' and ARGV[at + 8] == '' and parent == '' and not immunity_ms then
  -- the common message: its fields go to the XADD as they are, with no table made for them
  half_id = redis.call('XADD', half_stream, '*', 'transaction_id', txid, 'producer_group', group, 'topic', topic,
                       'partition', partition, 'born_ms', born_ms, 'body', ARGV[at + 5])
else
  local fields = {'transaction_id', txid, 'producer_group', group, 'topic', topic, 'partition', partition,
                  'born_ms', born_ms, 'body', ARGV[at + 5]}
  if ARGV[at + 6] ~= '' then fields[#fields + 1] = 'keys'; fields[#fields + 1] = ARGV[at + 6] end
  if ARGV[at + 7] ~= '' then fields[#fields + 1] = 'tags'; fields[#fields + 1] = ARGV[at + 7] end
  if ARGV[at + 8] ~= '' then fields[#fields + 1] = 'properties'; fields[#fields + 1] = ARGV[at + 8] end
  if parent ~= '' then
    fields[#fields + 1] = 'parent_transaction_id'; fields[#fields + 1] = parent
  end
  if immunity_ms then
    fields[#fields + 1] = 'check_immunity_ms'
    fields[#fields + 1] = string.format('%d', immunity_ms)
  end
  half_id = redis.call('XADD', half_stream, '*', unpack(fields))
end
