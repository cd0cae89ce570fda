-- fragment prepare_args: a prepare's arguments read and checked (SPEC §4.2), returning BADARG for a malformed one.
-- Inlined by the loader (lua/README.md) into: include/prepare_one.lua (prepare_half.lua) and prepare_halves.lua.
-- Expects in scope: at, the offset of this prepare's arguments in ARGV (ARGV[at + 1] .. are prepare_half's ARGV).
-- Defines: txid, group, topic, partition, immunity_ms (a number, or nil for the checker's transaction_timeout).
-- Returns from the script (or the function it is inlined in) {'ERR', 'BADARG', detail}. Commands: none.
local txid, group, topic, partition = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
if txid == '' or group == '' or topic == '' then
  return {'ERR', 'BADARG', 'transaction_id, producer_group and topic must not be empty'}
end
if not string.find(partition, '^%d+$') then
  return {'ERR', 'BADARG', 'partition must be a whole number, got ' .. partition}
end
local immunity_ms = nil
if ARGV[at + 9] ~= '' then
  immunity_ms = string.find(ARGV[at + 9], '^%d+$') and tonumber(ARGV[at + 9])
  if not immunity_ms or immunity_ms <= 0 or immunity_ms > 9007199254740992 then
    return {'ERR', 'BADARG', 'check_immunity_ms must be a whole number of ms from 1 to 2^53, got ' .. ARGV[at + 9]}
  end
end
