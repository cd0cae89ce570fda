-- fragment apply_outcome: apply the outcome of a transaction: on COMMIT append its message to the topic stream; in
-- every case write the op record and remember the outcome for the dedupe window. One call of the including script:
-- no crash can split these steps. Inlined by the loader (lua/README.md) into:
-- include/end_one.lua (the producer's and the checker's end, on the send path: end_transaction.lua and the batch
-- end_transactions.lua, where a `return` here is that end's reply) and dead_resolve.lua (an operator's decision on
-- a dead letter).
-- The time is the op record's id (the server's clock, as XADD reads it): no TIME call. It stays text on the common
-- path (a Lua number would go through printf and strtod); in the calls whose time ends in 0 ms (one in ten) the
-- outcomes past the window are forgotten in one batch of up to 256 (expire_ended.lua).
-- Expects in scope: the topic keys (topic_keys.lua);
--   txid        the transaction id
--   outcome     'COMMIT' or 'ROLLBACK'
--   half        the half message's fields as a table: transaction_id, producer_group, body, and keys, tags,
--               properties when it has them (the topic stream entry holds the fields a consumer in any language
--               reads: README)
--   half_id     its half message's entry id (kept in the op record and the remembered outcome)
--   source      who ends it: producer | checker | operator
--   remark      free text, '' for none
--   window_ms   the dedupe window in ms, a number >= 0 (0: the outcome is not remembered)
--   op_maxlen   approximate cap of the op stream, a number >= 1
-- Defines: committed_id (the topic stream entry's id, '' for ROLLBACK), op_id (the op record's id).
-- Returns from the script, having written nothing, {'ERR', 'WRONGTYPE' | 'REFUSED', detail} when the topic stream
-- refuses the message (the topic key holds another type, or the server is out of memory), and the READONLY error
-- itself on a replica (a demoted master: the client takes it for a lost connection and sends again to the master).
-- Commands: XADD to the topic stream on COMMIT, XADD to the op stream, HSET and ZADD with a dedupe window.
local committed_id = ''
if outcome == 'COMMIT' then
  local fields = {'transaction_id', half['transaction_id'], 'body', half['body']}
  if half['keys'] then fields[#fields + 1] = 'keys'; fields[#fields + 1] = half['keys'] end
  if half['tags'] then fields[#fields + 1] = 'tags'; fields[#fields + 1] = half['tags'] end
  if half['properties'] then fields[#fields + 1] = 'properties'; fields[#fields + 1] = half['properties'] end
  committed_id = redis.pcall('XADD', topic_stream, '*', unpack(fields))
  if type(committed_id) == 'table' then
    local err = tostring(committed_id['err'])
    if string.find(err, '^READONLY') then
      return redis.error_reply(err)  -- a demoted master: the client's connection error, it reconnects and resends
    end
    if string.find(err, 'WRONGTYPE', 1, true) then
      return {'ERR', 'WRONGTYPE', 'the topic key ' .. topic_stream .. ' holds another type than a stream'}
    end
    return {'ERR', 'REFUSED', 'the topic stream refused the message: ' .. err}
  end
end
local op_id = redis.call('XADD', op_stream, 'MAXLEN', '~', op_maxlen, '*',
  'transaction_id', txid, 'outcome', outcome, 'half_id', half_id, 'committed_id', committed_id,
  'source', source, 'remark', remark)
if window_ms > 0 then
  local now = string.match(op_id, '^%d+')
  redis.call('HSET', ended, txid, outcome .. '|' .. (committed_id ~= '' and committed_id or '-') .. '|' .. half_id
    .. '|' .. half['producer_group'])
  redis.call('ZADD', ended_at, now, txid)
  if string.byte(now, -1) == 48 then
    local limit = 256
    --#include expire_ended
  end
end
