-- fragment publish_outcome: what an outcome publishes: on COMMIT its message appended to the topic stream; in
-- every case the op record. Inlined by the loader (lua/README.md) into: include/apply_outcome.lua (which then
-- remembers the outcome) and end_transactions.lua (which remembers the outcomes of its ends after them).
-- The time is the op record's id (the server's clock, as XADD reads it): no TIME call.
-- Expects in scope: the topic keys (topic_keys.lua); txid, outcome ('COMMIT' or 'ROLLBACK'), half (the half
--   message's fields as a table: transaction_id, body, and keys, tags, properties when it has them: the topic
--   stream entry holds the fields a consumer in any language reads, README), half_id, source, remark, op_maxlen.
-- Defines: committed_id (the topic stream entry's id, '' for ROLLBACK), op_id (the op record's id).
-- Returns from the script (or the function it is inlined in), having written nothing, {'ERR', 'WRONGTYPE' |
-- 'REFUSED', detail} when the topic stream refuses the message (the topic key holds another type, or the server is
-- out of memory) or the op stream refuses the record (its key holds another type: the topic entry just written is
-- deleted again), and the READONLY error itself on a replica (a demoted master: the client takes it for a lost
-- connection and sends again to the master).
-- Commands: XADD to the topic stream on COMMIT, XADD to the op stream (XDEL of the topic entry when it fails).
local committed_id = ''
if outcome == 'COMMIT' then
  if half['keys'] or half['tags'] or half['properties'] then
    local fields = {'transaction_id', half['transaction_id'], 'body', half['body']}
    if half['keys'] then fields[#fields + 1] = 'keys'; fields[#fields + 1] = half['keys'] end
    if half['tags'] then fields[#fields + 1] = 'tags'; fields[#fields + 1] = half['tags'] end
    if half['properties'] then fields[#fields + 1] = 'properties'; fields[#fields + 1] = half['properties'] end
    committed_id = redis.pcall('XADD', topic_stream, '*', unpack(fields))
  else  -- the common message: no table to make for it
    committed_id = redis.pcall('XADD', topic_stream, '*', 'transaction_id', half['transaction_id'],
                               'body', half['body'])
  end
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
local op_id = redis.pcall('XADD', op_stream, 'MAXLEN', '~', op_maxlen, '*',
  'transaction_id', txid, 'outcome', outcome, 'half_id', half_id, 'committed_id', committed_id,
  'source', source, 'remark', remark)
if type(op_id) == 'table' then
  -- the topic entry goes again, in the same call (no reader saw it): a message published while its transaction
  -- stays in flight would be published again by the next end
  if committed_id ~= '' then
    redis.call('XDEL', topic_stream, committed_id)
  end
  local err = tostring(op_id['err'])
  if string.find(err, '^READONLY') then
    return redis.error_reply(err)
  end
  if string.find(err, 'WRONGTYPE', 1, true) then
    return {'ERR', 'WRONGTYPE', 'the op stream key ' .. op_stream .. ' holds another type than a stream'}
  end
  return {'ERR', 'REFUSED', 'the op stream refused the outcome\'s record: ' .. err}
end
