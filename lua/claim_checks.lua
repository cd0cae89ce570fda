-- claim_checks: pick the transactions of one topic partition that are due for a check-back (SPEC §4.5-4.6).
-- Called by every checker instance; each call claims distinct transactions, atomically, so instances share work.
-- A claimed transaction has its check counted and its next check scheduled one check_interval later: at most one
-- check per transaction per interval, however many checkers run. Over check_max checks or older than max_age, it is
-- moved whole to the dead-letter stream instead, unless it is a message of a transaction of several: that one is
-- given up (rescheduled, not counted) and the caller reads its transaction's record first. Indexed entries whose
-- half message is malformed are dead-lettered.
-- KEYS: the topic keys of topic_keys.lua.
-- ARGV[1] transaction_timeout_ms   check immunity of messages without their own
-- ARGV[2] check_interval_ms        time between two checks of one transaction
-- ARGV[3] check_max                checks before giving up
-- ARGV[4] max_age_ms               age (from born_ms) after which it is given up
-- ARGV[5] limit                    at most this many transactions per call
-- ARGV[6] dedupe_window_ms         outcomes (and op records) older than this are forgotten, up to 1000 per call
-- Reply: {'OK', {{transaction_id, half_id, check_times, half_fields, previous_request_id}, ...},
--              {{transaction_id, reason, producer_group, request_id}, ...},
--              {{transaction_id, half_id, reason, producer_group, parent_transaction_id}, ...},
--              seen_ms, next_ms}
--        (to check; dead-lettered; given up; the server time of this look; when to look at the topic next: its
--        earliest check due, or when its oldest remembered outcome leaves the dedupe window, '' when it holds
--        neither — the caller writes both to the checkers' schedule, lua/schedule_topics.lua)
--        or {'ERR', 'BADARG', detail}. A request id ('' for none) names the
--        transaction's pending check request in its producer group's stream (another hash slot): the caller
--        deletes it, so a transaction has at most one pending request and none once it is dead-lettered.

local timeout_ms, interval_ms, check_max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_age_ms, limit, window_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
-- in the form a NaN fails: every comparison with it is false
if not (timeout_ms and interval_ms and check_max and max_age_ms and limit and window_ms and timeout_ms >= 0
        and interval_ms > 0 and check_max >= 1 and max_age_ms > 0 and limit >= 1 and window_ms >= 0
        and window_ms <= 9007199254740992) then
  return fail('BADARG', 'need transaction_timeout_ms >= 0, check_interval_ms > 0, check_max >= 1, max_age_ms > 0, '
    .. 'limit >= 1, dedupe_window_ms from 0 to 2^53')
end

local now = now_ms()
expire_ended(now, window_ms, 1000)
local candidates = redis.call('ZRANGEBYSCORE', unchecked, '-inf', string.format('%d', now - timeout_ms), 'LIMIT', 0, limit)
if #candidates < limit then
  local more = redis.call('ZRANGEBYSCORE', due, '-inf', string.format('%d', now), 'LIMIT', 0, limit - #candidates)
  for i = 1, #more do
    candidates[#candidates + 1] = more[i]
  end
end

local to_check, buried, given_up = {}, {}, {}
for _, txid in ipairs(candidates) do
  local half_id = redis.call('HGET', inflight, txid)
  local entries = half_id and redis.call('XRANGE', half_stream, half_id, half_id) or {}
  local check_times = tonumber(redis.call('HGET', checks, txid) or '0') or 0
  local reason = nil
  local malformed = false
  local half = {}
  if not half_id then
    -- index without transaction (written by another tool): drop the stale index entries
    redis.call('ZREM', unchecked, txid)
    redis.call('ZREM', due, txid)
  elseif #entries == 0 then
    reason = 'half message ' .. half_id .. ' is missing from the half stream'
  else
    half = to_map(entries[1][2])
    local born = tonumber(half['born_ms'] or '')
    if half['transaction_id'] ~= txid or not half['producer_group'] or not half['body'] or not born then
      reason = 'malformed half message: needs transaction_id, producer_group, body and born_ms'
      malformed = true
    elseif check_times >= check_max then
      reason = 'check_max ' .. check_max .. ' checks reached'
    elseif now - born > max_age_ms then
      reason = 'older than max_age ' .. string.format('%d', max_age_ms) .. ' ms'
    end
  end
  if reason and half['parent_transaction_id'] and not malformed then
    -- a message of a transaction of several: the checker first reads (and pins) its transaction's record, in
    -- another slot: decided, the message is ended with the decision; undecided, it is buried (bury_half.lua)
    redis.call('ZREM', unchecked, txid)
    redis.call('ZADD', due, now + interval_ms, txid)
    given_up[#given_up + 1] = {txid, half_id, reason, half['producer_group'], half['parent_transaction_id']}
  elseif reason then
    local _, request_id = bury(txid, half_id, entries[1] and entries[1][2] or {'transaction_id', txid}, reason,
      check_times, now)
    buried[#buried + 1] = {txid, reason, half['producer_group'] or '', request_id}
  elseif half_id then
    redis.call('HINCRBY', checks, txid, 1)
    redis.call('ZREM', unchecked, txid)
    redis.call('ZADD', due, now + interval_ms, txid)
    to_check[#to_check + 1] = {txid, half_id, check_times + 1, entries[1][2], redis.call('HGET', requests, txid) or ''}
  end
end

local next_ms = nil
local first = redis.call('ZRANGE', unchecked, 0, 0, 'WITHSCORES')
if #first > 0 then
  next_ms = tonumber(first[2]) + timeout_ms
end
first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if #first > 0 and (not next_ms or tonumber(first[2]) < next_ms) then
  next_ms = tonumber(first[2])
end
first = redis.call('ZRANGE', ended_at, 0, 0, 'WITHSCORES')
if #first > 0 and (not next_ms or tonumber(first[2]) + window_ms < next_ms) then
  next_ms = tonumber(first[2]) + window_ms
end
return {'OK', to_check, buried, given_up, string.format('%d', now), next_ms and string.format('%d', next_ms) or ''}
