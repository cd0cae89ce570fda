-- fragment read_half: an end's half message read and matched to the end (its id as expected, its transaction and
-- group the end's), and an UNKNOWN outcome's remark recorded (UNKNOWN ends nothing). Inlined by the loader
-- (lua/README.md) into: include/end_one.lua (end_transaction.lua) and end_transactions.lua.
-- Expects in scope: the topic keys (topic_keys.lua); txid, group, outcome, remark, expected_half (end_args.lua);
--   half_id     the transaction's half message id (in flight);
--   read_ahead  half message id -> its fields (flat), of those the caller read already (an empty table for none).
-- Defines: half, the half message's fields as a table.
-- Returns from the script (or the function it is inlined in) BADARG, CORRUPT, GROUP_MISMATCH, or UNKNOWN's reply.
-- Commands: XRANGE, unless read ahead (HSET of the remark for an UNKNOWN with one).
if expected_half ~= '' and expected_half ~= half_id then
  return {'ERR', 'BADARG', 'the transaction has half message ' .. half_id .. ', not ' .. expected_half}
end

local flat = read_ahead[half_id]
if not flat then
  local entries = redis.call('XRANGE', half_stream, half_id, half_id)
  if #entries == 0 then
    return {'ERR', 'CORRUPT', 'half message ' .. half_id .. ' is indexed but missing from the half stream'}
  end
  flat = entries[1][2]
end
-- The first six fields in the order half_fields.lua writes them are taken by place, in one table made at its size
-- (filled field by field, a table is grown again at every power of two), the rest by name; a half message in
-- another order (written by another tool) is read field by field. Either way a field written twice counts with its
-- last value.
local half
if flat[1] == 'transaction_id' and flat[3] == 'producer_group' and flat[5] == 'topic' and flat[7] == 'partition'
    and flat[9] == 'born_ms' and flat[11] == 'body' then
  half = {transaction_id = flat[2], producer_group = flat[4], topic = flat[6], partition = flat[8],
          born_ms = flat[10], body = flat[12]}
  for i = 13, #flat, 2 do
    half[flat[i]] = flat[i + 1]
  end
else
  half = {}
  for i = 1, #flat, 2 do
    half[flat[i]] = flat[i + 1]
  end
end
if half['transaction_id'] ~= txid then
  return {'ERR', 'CORRUPT', 'half message ' .. half_id .. ' belongs to transaction ' .. tostring(half['transaction_id'])}
end
if half['producer_group'] ~= group then
  return {'ERR', 'GROUP_MISMATCH', 'the half message belongs to producer group ' .. tostring(half['producer_group'])}
end

if outcome == 'UNKNOWN' then
  if remark ~= '' then
    redis.call('HSET', remarks, txid, remark)
  end
  return {'OK', 'PREPARED', half_id, '', 'RECORDED', ''}
end
