-- note_requests: remember the check request just sent for each transaction, so that the transaction has at most
-- one pending request and the request is deleted when the transaction ends or is dead-lettered (claim_checks and
-- end_transaction return its id). A transaction that ended between its claim and this call keeps no index entry:
-- its request id comes back as stale and the caller deletes that request.
-- KEYS: the topic keys of topic_keys.lua (uses inflight, requests).
-- ARGV: pairs of transaction_id, request_id (entry id in the producer group's check-request stream)
-- Reply: {'OK', {stale_request_id, ...}} or {'ERR', 'BADARG', detail}.

if #ARGV % 2 ~= 0 then
  return fail('BADARG', 'need pairs of transaction_id, request_id')
end
local stale = {}
for i = 1, #ARGV, 2 do
  local txid, request_id = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', inflight, txid) == 1 then
    redis.call('HSET', requests, txid, request_id)
  else
    stale[#stale + 1] = request_id
  end
end
return {'OK', stale}
