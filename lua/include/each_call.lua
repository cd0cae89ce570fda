-- each_call: the loop of a batch script (end_transactions, prepare_halves): call_one(at) for every call of ARGV
-- (its width, then whole calls of that width), each under pcall, so that a call's `return` (e.g. a refusal) or a
-- command failing inside it is that call's reply alone ({err = ...}) and the others still apply.
-- Expects in scope: width (checked by the script), call_one(at) (one call, its ARGV from at + 1).
-- Defines: replies, the list of replies, one per call, in order (the script returns it, after the writes it makes
-- once for all its calls). Returns from the script, when a call met a replica (READONLY, MASTERDOWN), that error for
-- the whole script: a replica wrote nothing for any call. Commands: none of its own.
local replies = {}
for at = 1, #ARGV - 1, width do
  local ok, reply = pcall(call_one, at)
  if not ok then
    -- Redis hands a failed command's error to pcall as its text (some servers as a table with `err`)
    local message = type(reply) == 'table' and reply['err'] or tostring(reply)
    if not string.find(message, '^%u[%u_]* ') then
      message = 'ERR ' .. message
    end
    reply = {err = message}
  end
  if type(reply) == 'table' and type(reply['err']) == 'string'
      and (string.find(reply['err'], '^READONLY') or string.find(reply['err'], '^MASTERDOWN')) then
    -- a replica (its master failed over) wrote nothing for any call: the whole call fails as one call would, so
    -- that the client reconnects to the new master and sends it again (every call is idempotent)
    return reply
  end
  replies[#replies + 1] = reply
end
