-- fragment batch_calls: a batch script's ARGV checked (the width of a call's arguments, then at most 2000 whole
-- calls of that width), and the transaction ids of its calls. Inlined by the loader (lua/README.md) into:
-- end_transactions.lua and prepare_halves.lua, at their top level.
-- Expects in scope: batch_name (the script's name, for the error), min_width (the fewest arguments of a call).
-- Defines: width, txids (each call's first argument, in order).
-- Returns from the script an error reply for a malformed ARGV, and {} for no calls. Commands: none.
local width = tonumber(ARGV[1])
if not width or width < min_width or width % 1 ~= 0 or (#ARGV - 1) % width ~= 0 or (#ARGV - 1) / width > 2000 then
  return redis.error_reply('ERR ' .. batch_name .. ': ARGV must be a width >= ' .. min_width
    .. ' then at most 2000 whole calls of that width, got ' .. #ARGV .. ' arguments')
end
if #ARGV == 1 then
  return {}
end

local txids = {}
for at = 1, #ARGV - 1, width do
  txids[#txids + 1] = ARGV[at + 1]
end
