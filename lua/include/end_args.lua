-- fragment end_args: an end's arguments read and checked (SPEC §4.4), returning BADARG for a malformed one.
-- Inlined by the loader (lua/README.md) into: include/end_one.lua (end_transaction.lua) and end_transactions.lua.
-- Expects in scope: at, the offset of this end's arguments in ARGV: ARGV[at + 1] .. ARGV[at + 8] are
--   end_transaction's ARGV[1] .. ARGV[8].
-- Defines: txid, group, outcome, source, remark, window_ms (a number), op_maxlen (a number), expected_half.
-- Returns from the script (or the function it is inlined in) {'ERR', 'BADARG', detail}. Commands: none.
local txid, group, outcome, source, remark = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
local window_ms, op_maxlen, expected_half = tonumber(ARGV[at + 6]), tonumber(ARGV[at + 7]), ARGV[at + 8]
if txid == '' or group == '' then
  return {'ERR', 'BADARG', 'transaction_id and producer_group must not be empty'}
end
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' and outcome ~= 'UNKNOWN' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT, ROLLBACK or UNKNOWN, got ' .. outcome}
end
if not window_ms or window_ms < 0 or not op_maxlen or op_maxlen < 1 then
  return {'ERR', 'BADARG', 'dedupe_window_ms must be >= 0 and op_stream_maxlen >= 1'}
end
