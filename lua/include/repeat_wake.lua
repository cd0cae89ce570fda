-- fragment repeat_wake: the reply to a repeat of a prepare whose transaction is still in flight, with the wake of
-- its topic again where the caller writes it (Cluster: KEYS[14] not passed). redis-py sends a command again when
-- its reply is lost; the lost reply carried the wake, and a DUPLICATE without one left the topic unwoken (later
-- prepares join a non-empty `unchecked` and wake nothing: the check-backs waited for a checker's full pass). So a
-- repeat answers the wake the first call replied, its born time, as long as no check of it was counted (a look that
-- checked it wrote the topic's next time itself): when it is still in `unchecked` (its score there), or, with its
-- own immunity, in `due` with no check counted (its score less that immunity, at most its half id's time). It
-- wakes also when the first call joined a non-empty `unchecked` and did not need to: a past time only makes a
-- checker look in its next round. With the schedule passed, the first call wrote the wake itself: none.
-- Inlined by the loader (lua/README.md) into: include/prepare_one.lua (prepare_half.lua) and prepare_halves.lua.
-- Expects in scope: the topic keys (topic_keys.lua: schedule, unchecked, due, checks); txid and immunity_ms
-- (prepare_args.lua); half_id, the first call's;
--   pending_born  the born_ms of a half message written earlier in the same call whose ZADD of `unchecked` is still
--                 to come (prepare_halves.lua), else nil.
-- Returns from the script (or the function it is inlined in) the prepare's reply. Commands: none with the schedule
-- passed; else ZSCORE unchecked, or HEXISTS checks and ZSCORE due with an own immunity.
local wake = ''
if not schedule then
  if not immunity_ms then
    wake = pending_born or redis.call('ZSCORE', unchecked, txid) or ''
  elseif redis.call('HEXISTS', checks, txid) == 0 then
    local next_check = redis.call('ZSCORE', due, txid)
    if next_check then
      local born = math.min(tonumber(next_check) - immunity_ms, tonumber(string.match(half_id, '^%d+')))
      wake = string.format('%d', born)
    end
  end
end
return {'OK', half_id, 'PREPARED', 'DUPLICATE', wake}
