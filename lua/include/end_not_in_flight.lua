-- fragment end_not_in_flight: the reply to an end of a transaction that is not in flight: from its remembered
-- outcome (a repeat: DUPLICATE, or CONFLICT for the other outcome, GROUP_MISMATCH for another group), else DEAD or
-- NOT_FOUND. Inlined by the loader (lua/README.md) into: include/end_one.lua (end_transaction.lua) and
-- end_transactions.lua, where the remembered outcome may be one written earlier in the same call.
-- Expects in scope: the topic keys (topic_keys.lua); txid, group, outcome (end_args.lua);
--   prior  the remembered outcome (`ended`: "<state>|<committed id or ->|<half id>|<group>"), or false / nil.
-- Returns from the script (or the function it is inlined in) on every path. Commands: HEXISTS without `prior`.
if prior then
  local state, committed, prior_half, prior_group = string.match(prior, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)')
  if prior_group ~= group then
    return {'ERR', 'GROUP_MISMATCH', 'the transaction belongs to producer group ' .. tostring(prior_group)}
  end
  if outcome == 'UNKNOWN' or outcome == state then
    return {'OK', state, prior_half, committed == '-' and '' or committed, 'DUPLICATE', ''}
  end
  return {'ERR', 'CONFLICT', 'the transaction already ended with ' .. state}
end
if redis.call('HEXISTS', dead_index, txid) == 1 then
  return {'ERR', 'DEAD', 'the transaction is in the dead-letter stream'}
end
return {'ERR', 'NOT_FOUND',
        'no in-flight transaction with this id (never prepared, or ended longer ago than the dedupe window)'}
