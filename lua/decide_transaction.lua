-- decide_transaction: the decision of a transaction of several messages, written once (SPEC §4.4 for many).
-- The messages' half messages live in the half streams of their topics' partitions (other hash slots); each is
-- then ended with end_transaction.lua by whoever finds the decision here: the producer right after deciding, or
-- the checker when the producer died before ending them all. The first decision stands: a later call with
-- another outcome gets the first one back (DUPLICATE), so every half message follows the same decision.
-- KEYS[1] decision   hash   txmq:decision:{<transaction id>}: outcome, producer_group, source, decided_ms
-- ARGV[1] transaction_id
-- ARGV[2] producer_group     must match the group of an earlier decision
-- ARGV[3] outcome            COMMIT | ROLLBACK
-- ARGV[4] source             who decides: producer | checker
-- ARGV[5] keep_ms            how long the decision is kept (its half messages are ended long before)
-- Reply: {'OK', outcome, 'DECIDED' | 'DUPLICATE'} or {'ERR', code, detail} with code BADARG | GROUP_MISMATCH.

local txid, group, outcome, source, keep_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if txid == '' or group == '' or source == '' then
  return {'ERR', 'BADARG', 'transaction_id, producer_group and source must not be empty'}
end
if outcome ~= 'COMMIT' and outcome ~= 'ROLLBACK' then
  return {'ERR', 'BADARG', 'outcome must be COMMIT or ROLLBACK, got ' .. outcome}
end
if not keep_ms or keep_ms < 1 then
  return {'ERR', 'BADARG', 'keep_ms must be >= 1'}
end

local prior = redis.call('HMGET', KEYS[1], 'outcome', 'producer_group')
if prior[1] then
  if prior[2] ~= group then
    return {'ERR', 'GROUP_MISMATCH', 'the transaction belongs to producer group ' .. tostring(prior[2])}
  end
  return {'OK', prior[1], 'DUPLICATE'}
end
local time = redis.call('TIME')
redis.call('HSET', KEYS[1], 'outcome', outcome, 'producer_group', group, 'source', source,
  'decided_ms', time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3))
redis.call('PEXPIRE', KEYS[1], keep_ms)
return {'OK', outcome, 'DECIDED'}
