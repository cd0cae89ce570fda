-- sweep_half: walk the half stream slowly and dead-letter entries that no transaction owns (written by another
-- tool, or malformed), so that nothing in a half stream is left unexplained. Resumable: returns the next cursor.
-- KEYS: the topic keys of topic_keys.lua.
-- ARGV[1] cursor    exclusive start id ('0-0' to start over)
-- ARGV[2] count     entries to look at in this call
-- Reply: {'OK', next_cursor ('0-0' when the end was reached), {{entry_id, reason}, ...}}

local cursor, count = ARGV[1], tonumber(ARGV[2])
if not count or count < 1 then
  return fail('BADARG', 'count must be >= 1')
end
local entries = redis.call('XRANGE', half_stream, '(' .. cursor, '+', 'COUNT', count)
local buried = {}
local now = nil
for _, entry in ipairs(entries) do
  local entry_id, half = entry[1], to_map(entry[2])
  local txid = half['transaction_id'] or ''
  if txid == '' or redis.call('HGET', inflight, txid) ~= entry_id then
    now = now or now_ms()
    local reason = 'half message not owned by an in-flight transaction (malformed or written by another tool)'
    -- an owner-less entry must not take over the dead-letter index of a transaction that has its own half message
    local owner = txid ~= '' and redis.call('HEXISTS', inflight, txid) == 0 and txid or ''
    bury(owner, entry_id, entry[2], reason, 0, now)
    buried[#buried + 1] = {entry_id, reason}
  end
end
local next_cursor = '0-0'
if #entries == count then
  next_cursor = entries[#entries][1]
end
return {'OK', next_cursor, buried}
