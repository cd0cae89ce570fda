-- note_requests: remember the check request just sent for each transaction, so that the transaction has at most
-- one pending request and the request is deleted when the transaction ends or is dead-lettered (claim_checks and
-- end_transaction return its id). A transaction that ended between its claim and this call keeps no index entry:
-- its request id comes back as stale and the caller deletes that request.
-- check_max counts checks that reached a producer: claim_checks counts each check when it is claimed, and the
-- request it replaces, if no producer instance ever read it (the caller saw it still in the stream and in no
-- consumer's pending list when it deleted it), is given back here: its check is taken off the count, never below 0.
-- Given back only while that request is still the one noted for the transaction, so a call repeated after a lost
-- reply gives nothing back twice. A check that was claimed but never sent (its producer group's stream could not
-- be written: its cluster master is down) is no answer either: its check is given back while the count is still
-- the one its claim left (again, nothing twice), and the request noted before stays noted.
-- KEYS: the topic keys of topic_keys.lua (uses inflight, checks, requests).
-- ARGV: triples of transaction_id, request_id (entry id in the producer group's check-request stream),
--       unread_request_id (the request this one replaced, if nobody read it; '' otherwise);
--       for a check never sent: transaction_id, '', and the check count its claim left (an integer >= 1)
-- Reply: {'OK', {stale_request_id, ...}, given_back} or {'ERR', 'BADARG', detail}.

if #ARGV % 3 ~= 0 then
  return fail('BADARG', 'need triples of transaction_id, request_id, unread_request_id')
end
for i = 1, #ARGV, 3 do
  if ARGV[i] == '' then
    return fail('BADARG', 'need a transaction_id in every triple')
  end
  if ARGV[i + 1] == '' and not (string.match(ARGV[i + 2], '^[1-9]%d*$') and #ARGV[i + 2] <= 15) then
    return fail('BADARG', 'a check never sent (no request_id) needs the check count of its claim, an integer >= 1')
  end
end
local stale = {}
local given_back = 0
for i = 1, #ARGV, 3 do
  local txid, request_id, third = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if request_id == '' then
    -- never sent: third is the count its claim left
    if redis.call('HEXISTS', inflight, txid) == 1 and redis.call('HGET', checks, txid) == third then
      redis.call('HINCRBY', checks, txid, -1)
      given_back = given_back + 1
    end
  elseif redis.call('HEXISTS', inflight, txid) == 1 then
    -- third is the request this one replaced, if nobody read it
    if third ~= '' and redis.call('HGET', requests, txid) == third then
      if (tonumber(redis.call('HGET', checks, txid) or '0') or 0) > 0 then
        redis.call('HINCRBY', checks, txid, -1)
        given_back = given_back + 1
      end
    end
    redis.call('HSET', requests, txid, request_id)
  else
    stale[#stale + 1] = request_id
  end
end
return {'OK', stale, given_back}
