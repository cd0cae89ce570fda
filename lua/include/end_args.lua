-- fragment end_args: an end's arguments read and checked (SPEC §4.4), returning BADARG for a malformed one.
-- Inlined by the loader (lua/README.md) into: include/end_one.lua (end_transaction.lua) and end_transactions.lua.
-- Expects in scope: at, the offset of this end's arguments in ARGV: ARGV[at + 1] .. ARGV[at + 8] are
--   end_transaction's ARGV[1] .. ARGV[8];
--   known  nil for one end alone; in a batch a table the fragment fills with the last end's two numbers, their text
--          and their values (checked), so that ends sending the same (all of a producer's) read them once.
-- Defines: txid, group, outcome, source, remark, window_ms (a number), op_maxlen (what the op stream's XADD gets
--   after MAXLEN ~: the text sent when it is a whole number written plainly, which Redis would write back the same,
--   else the number), expected_half.
-- Returns from the script (or the function it is inlined in) {'ERR', 'BADARG', detail}. Commands: none.
local txid, group, outcome, source, remark = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
local window_text, maxlen_text, expected_half = ARGV[at + 6], ARGV[at + 7], ARGV[at + 8]
local checked = known and window_text == known[1] and maxlen_text == known[2]
local window_ms, op_maxlen
if checked then
  window_ms, op_maxlen = known[3], known[4]
else
  window_ms, op_maxlen = tonumber(window_text), tonumber(maxlen_text)
end
if txid == '' or group == '' then
  return {'ERR', 'BADARG', 'transaction_id and producer_group must not be empty'}
end
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' and outcome ~= 'UNKNOWN' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT, ROLLBACK or UNKNOWN, got ' .. outcome}
end
if not checked then
  --#include outcome_numbers
  if numbers_refused then
    return {'ERR', 'BADARG', numbers_refused}
  end
  if #maxlen_text < 16 and string.find(maxlen_text, '^[1-9]%d*$') then
    op_maxlen = maxlen_text  -- no printf of the number on its way to the XADD
  end
  if known then
    known[1], known[2], known[3], known[4] = window_text, maxlen_text, window_ms, op_maxlen
  end
end
