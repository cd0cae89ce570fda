-- decide_transaction: the record of a transaction of several messages (SPEC §4.4 for many), in its own slot. It
-- holds the decision, written once (the first decision stands: a later call with another outcome gets the first
-- one back, so every half message follows it); the messages whose send did not return (`voided`: rolled back
-- whatever the decision, so a send that raised is never published and a retried one is published once); and the
-- messages in the dead-letter stream (`dead`: while any is there, the record does not expire, so an operator's
-- resolution can never decide the other way of what was published).
-- The messages' half messages live in the half streams of their topics' partitions (other hash slots); each is
-- ended with end_transaction.lua by whoever reads this record: the producer right after deciding, or the checker.
-- KEYS[1] record   hash  txmq:decision:{<transaction id>}: outcome, producer_group, source, decided_ms,
--                        voided (' <i> <j> ... '), dead (' <i> ... ')
-- ARGV[1] transaction_id
-- ARGV[2] producer_group   must match the group that wrote the record
-- ARGV[3] action           COMMIT | ROLLBACK   decide (with ARGV[6] the indices of the sends that did not return)
--                          VOID                ARGV[6]'s sends did not return (no effect once decided: the reply
--                                              says the decision, which those messages then follow)
--                          PIN                 the checker gives up on ARGV[6]'s messages: they are dead-lettered
--                                              next, unless the reply shows a decision (nothing written then:
--                                              they are ended with it)
--                          UNPIN               ARGV[6]'s dead letters were resolved or re-checked
--                          READ                nothing written
-- ARGV[4] source           who acts: producer | checker | operator
-- ARGV[5] keep_ms          how long the record is kept once none of its messages is dead-lettered
-- ARGV[6] indices          message indices, space-separated, '' for none
-- Reply: {'OK', outcome or '', voided, status, dead} with status DECIDED (this call decided) | DUPLICATE (a
--        decision stood) | UNDECIDED, or {'ERR', code, detail} with code BADARG | GROUP_MISMATCH.

local txid, group, action, source, keep_ms, indices = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
if txid == '' or group == '' or source == '' then
  return {'ERR', 'BADARG', 'transaction_id, producer_group and source must not be empty'}
end
if action ~= 'COMMIT' and action ~= 'ROLLBACK' and action ~= 'VOID' and action ~= 'PIN' and action ~= 'UNPIN'
    and action ~= 'READ' then
  return {'ERR', 'BADARG', 'action must be COMMIT, ROLLBACK, VOID, PIN, UNPIN or READ, got ' .. action}
end
if not keep_ms or keep_ms < 1 then
  return {'ERR', 'BADARG', 'keep_ms must be >= 1'}
end
indices = indices or ''
if not string.find(indices, '^[%d ]*$') then
  return {'ERR', 'BADARG', 'indices must be whole numbers separated by spaces, got ' .. indices}
end

local record = KEYS[1]
local prior = redis.call('HMGET', record, 'outcome', 'producer_group', 'voided', 'dead')
local outcome, owner, voided, dead = prior[1], prior[2], prior[3] or ' ', prior[4] or ' '
if owner and owner ~= group then
  return {'ERR', 'GROUP_MISMATCH', 'the transaction belongs to producer group ' .. tostring(owner)}
end
if action == 'READ' then
  return {'OK', outcome or '', voided, outcome and 'DUPLICATE' or 'UNDECIDED', dead}
end

-- ' 1 4 ' with ' 7 ' added, each index once
local function with(set, list)
  for index in string.gmatch(list, '%d+') do
    if not string.find(set, ' ' .. index .. ' ', 1, true) then
      set = set .. index .. ' '
    end
  end
  return set
end

local status = outcome and 'DUPLICATE' or 'UNDECIDED'
if action == 'COMMIT' or action == 'ROLLBACK' then
  if not outcome then
    voided = with(voided, indices)
    local time = redis.call('TIME')
    redis.call('HSET', record, 'outcome', action, 'producer_group', group, 'source', source, 'voided', voided,
      'decided_ms', time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3))
    outcome, status = action, 'DECIDED'
  end
elseif action == 'VOID' then
  if not outcome then
    voided = with(voided, indices)
    redis.call('HSET', record, 'producer_group', group, 'voided', voided)
  end
elseif action == 'PIN' then
  if not outcome then
    dead = with(dead, indices)
    redis.call('HSET', record, 'producer_group', group, 'dead', dead)
  end
else
  for index in string.gmatch(indices, '%d+') do
    dead = string.gsub(dead, ' ' .. index .. ' ', ' ', 1)
  end
  if redis.call('EXISTS', record) == 1 then
    redis.call('HSET', record, 'dead', dead)
  end
end

-- kept while a message is dead-lettered (an operator may still resolve it), else for keep_ms after the last write
if redis.call('EXISTS', record) == 1 then
  if dead ~= ' ' then
    redis.call('PERSIST', record)
  else
    redis.call('PEXPIRE', record, keep_ms)
  end
end
return {'OK', outcome or '', voided, status, dead}
