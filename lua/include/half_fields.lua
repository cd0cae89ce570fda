-- fragment half_fields: a half message's fields: what the prepare was given, its birth time, and the fields it
-- has only when set. Inlined by the loader (lua/README.md) into: include/prepare_one.lua (prepare_half.lua) and
-- prepare_halves.lua.
-- Expects in scope: at, width (prepare_one.lua); txid, group, topic, partition, immunity_ms (prepare_args.lua);
--   time  the server's TIME reply.
-- Defines: born_ms (the time in ms, as text: a Lua number would go through printf and strtod on its way to the XADD
--   and the ZADD), fields (the XADD's field list). Commands: none.
local born_ms = time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3)
local fields = {'transaction_id', txid, 'producer_group', group, 'topic', topic, 'partition', partition,
                'born_ms', born_ms, 'body', ARGV[at + 5]}
if ARGV[at + 6] ~= '' then fields[#fields + 1] = 'keys'; fields[#fields + 1] = ARGV[at + 6] end
if ARGV[at + 7] ~= '' then fields[#fields + 1] = 'tags'; fields[#fields + 1] = ARGV[at + 7] end
if ARGV[at + 8] ~= '' then fields[#fields + 1] = 'properties'; fields[#fields + 1] = ARGV[at + 8] end
if width >= 10 and ARGV[at + 10] and ARGV[at + 10] ~= '' then
  fields[#fields + 1] = 'parent_transaction_id'; fields[#fields + 1] = ARGV[at + 10]
end
if immunity_ms then
  fields[#fields + 1] = 'check_immunity_ms'
  fields[#fields + 1] = string.format('%d', immunity_ms)
end
