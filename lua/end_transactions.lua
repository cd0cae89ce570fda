-- end_transactions: apply the ends of many transactions of one topic partition in one call, each with the rules of
-- end_transaction.lua (lua/include/end_one.lua), in order, each atomic with the others (one script). What the
-- asyncio lane sends when several ends to the same topic keys are in flight together (redis_txmq/asyncio/lane.py).
-- KEYS: the topic keys of topic_keys.lua, those of every end of the call.
-- ARGV[1] width              the number of arguments of each end (8)
-- ARGV[2] ..                 the ends, `width` arguments each, each laid out as end_transaction's ARGV[1] .. [8];
--                            at most 2000 ends
-- Reply: one reply per end, in order: end_transaction's reply ({'OK', ...} or {'ERR', code, detail}), or the error
--        reply of a command that failed inside that end (the Lua error end_transaction would have raised: a
--        redis.call refused, e.g. a half stream written over with another type; out of memory at an end's first
--        write is its {'ERR', 'REFUSED', detail}); the ends before and after it still run. An error reply for the
--        whole call for a malformed ARGV, and when the server is a replica (READONLY, MASTERDOWN: each_call.lua).
-- Cost: the indexes are read and written once per call, not once per end. Before the ends, one HMGET of
-- `inflight` and one ZMSCORE of `unchecked` (which transactions are in flight, which were never checked) and one
-- XRANGE reading their half messages ahead (below); after
-- them, one HSET of `ended`, ZADD of `ended_at`, XDEL of the half messages, HDEL of `inflight`, ZREM of `unchecked`
-- (and HDEL of `remarks`) for all the ends applied. In between, each end reads and updates local tables standing for
-- those keys (`half_of`, `unchecked_of`, `ended_of`), so an end sees every end before it in the call exactly as
-- the second of two end_transaction calls sees the first: a transaction ended twice in one call is applied once
-- and answered DUPLICATE (or CONFLICT) the second time. What an end still does itself on the common path (a COMMIT
-- of a never-checked transaction): XADD to the topic stream, XADD of the op record.
-- The rest of the rules are end_one.lua's, line for line; tests/test_batch_equivalence.py runs random calls through
-- this script and through end_transaction one by one and compares the replies and every key.
-- Every end is idempotent, so a batch sent twice (after a connection error) or holding the same end twice applies
-- each once. An end that fails part-way has written what end_transaction would have written before failing
-- (scripts do not roll back; the writes after the ends carry what the failed end had written up to its failure):
-- out of memory refuses its first write, so nothing; a companion key of another type (written over by another
-- tool) fails a write after the topic entry: the op stream's, and that end deletes its topic entry again and is
-- refused (WRONGTYPE), as end_transaction does; `ended`, `ended_at` or `remarks`, written after the ends, and the
-- ends are published and retired but not remembered (see the end);
-- `ended`, `ended_at` or `remarks` refusing the sweep of expired outcomes, made last, leaves the ends applied.
-- The sweeps of remembered outcomes past the dedupe window (expire_ended) that an end whose time ends in 0 ms makes
-- in end_transaction are made after the ends, together: an outcome they forget is remembered for every end of the
-- call (a repeat inside the call is a DUPLICATE, where end_transaction would have forgotten it after the sweep:
-- only for an outcome ending its window within the call's millisecond).
-- No helper functions but two: the end runs in a function, made once per call (not per end), so that each of its
-- `return`s ends that end only, and pcall keeps a failed command to that end's reply; the sweep runs in one, when
-- an end asked for it, so that pcall keeps its failure from the ends.

local batch_name, min_width = 'end_transactions', 8
--#include batch_calls
-- `unchecked_of` by the end's place in the call (`unchecked` is only read before the ends: an end that finds its
-- transaction retired by an earlier end of the call does not look at it), `half_of` by transaction id
local half_of, ended_of, unchecked_of = {}, {}, nil
do
  local in_flight = redis.call('HMGET', inflight, unpack(txids))
  unchecked_of = redis.call('ZMSCORE', unchecked, unpack(txids))
  for i = 1, #txids do
    half_of[txids[i]] = in_flight[i]
  end
end
-- The half messages of the ends in flight, in one XRANGE from the lowest id to the highest when they lie close
-- together (the common case: sends in flight together were prepared together), read ahead: at most twice as many
-- entries as there are ends, so that a call among many older transactions in flight reads no more than that; an
-- end whose half message was not among them reads it itself (read_half.lua). Half messages do not change, and the
-- call deletes its ends' after them. Memory: up to twice the bodies of the call's ends at once (a call of prepares
-- carries its bodies in its arguments).
-- The lowest and highest id: ids of one length with the '-' at one place (most of a call's: its half messages were
-- written in the same few milliseconds) are in the order of their text (digits at the same places, in any locale),
-- compared without reading them as numbers; only the lowest and highest of each such layout are read as numbers.
local read_ahead = {}
do
  -- the layout (length * 64 + place of '-': an entry id has at most 41 characters) -> its lowest / highest id
  local low_of, high_of = {}, {}
  for i = 1, #txids do
    local id = half_of[txids[i]]
    if id then
      local dash = string.find(id, '-', 2, true)
      if dash then  -- else not an entry id (the index written over): its end reads it, and fails, alone
        local layout = #id * 64 + dash
        local low = low_of[layout]
        if not low then
          low_of[layout], high_of[layout] = id, id
        elseif id < low then
          low_of[layout] = id
        elseif id > high_of[layout] then
          high_of[layout] = id
        end
      end
    end
  end
  local low, high, low_ms, low_seq, high_ms, high_seq
  for layout, first in pairs(low_of) do
    for _, id in ipairs({first, high_of[layout]}) do
      local ms, seq = string.match(id, '^(%d+)-(%d+)$')
      ms, seq = tonumber(ms), tonumber(seq)
      if ms and seq then
        if not low or ms < low_ms or (ms == low_ms and seq < low_seq) then
          low, low_ms, low_seq = id, ms, seq
        end
        if not high or ms > high_ms or (ms == high_ms and seq > high_seq) then
          high, high_ms, high_seq = id, ms, seq
        end
      end
    end
  end
  -- refused (an id the server does not take, a half stream of another type): each end reads its own, as alone
  local entries = low and redis.pcall('XRANGE', half_stream, low, high, 'COUNT', 2 * #txids)
  if entries and not entries['err'] then
    for _, entry in ipairs(entries) do
      read_ahead[entry[1]] = entry[2]
    end
  end
end
-- what the call writes after its ends: the outcomes remembered, the transactions retired, and the sweep of
-- outcomes past the window that an end asked for (as end_transaction does one end in ten)
local ended_fields, ended_times, half_ids, retired, unchecked_retired, remarks_dropped = {}, {}, {}, {}, {}, {}
local sweep_now, sweep_window_ms, sweeps = nil, nil, 0
-- the last end's dedupe window and op stream cap, as given and as checked (end_args.lua)
local known = {}

local function call_one(at)
  --#include end_args

  local half_id = half_of[txid]
  if not half_id then
    local prior = ended_of[txid]
    if prior == nil then
      prior = redis.call('HGET', ended, txid)
    end
    --#include end_not_in_flight
  end
  --#include read_half

  --#include publish_outcome
  -- apply_outcome.lua's remembered outcome, written after the ends
  if window_ms > 0 then
    local now = string.match(op_id, '^%d+')
    --#include outcome_record
    ended_of[txid] = record
    ended_fields[#ended_fields + 1] = txid
    ended_fields[#ended_fields + 1] = record
    ended_times[#ended_times + 1] = now
    ended_times[#ended_times + 1] = txid
    if string.byte(now, -1) == 48 then
      -- the sweep forgets only what every end that asked would: the earliest cutoff (ends of one producer share
      -- their window; a caller mixing windows must not have a short one forget another's outcomes)
      if not sweep_now or tonumber(now) - window_ms < tonumber(sweep_now) - sweep_window_ms then
        sweep_now, sweep_window_ms = now, window_ms
      end
      sweeps = sweeps + 1
    end
  end

  -- retire_half.lua, the common path's writes made after the ends
  half_ids[#half_ids + 1] = half_id
  retired[#retired + 1] = txid
  half_of[txid] = false
  local request_id = ''
  if unchecked_of[(at - 1) / width + 1] then
    unchecked_retired[#unchecked_retired + 1] = txid
    if window_ms == 0 then
      remarks_dropped[#remarks_dropped + 1] = txid
    end
  else
    --#include retire_checked
  end
  return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
end

--#include each_call

-- The index writes after the ends, the retirement first: once its half message is retired an end is not applied
-- again. A companion key of another type (written over by another tool) refuses its write and the others are
-- still made: an end whose outcome could not be remembered (`ended`, `ended_at`) is still published once and
-- retired, and answered as applied; a repeat of it finds it no longer in flight (NOT_FOUND, or the refusal of
-- `ended`) instead of publishing it a second time.
for _, write in ipairs({{'XDEL', half_stream, half_ids}, {'HDEL', inflight, retired},
                        {'ZREM', unchecked, unchecked_retired}, {'HSET', ended, ended_fields},
                        {'ZADD', ended_at, ended_times}, {'HDEL', remarks, remarks_dropped}}) do
  if #write[3] > 0 then
    redis.pcall(write[1], write[2], unpack(write[3]))
  end
end
-- The sweep last, with the time and window of the end that asked for it with the earliest cutoff, forgetting as
-- many outcomes as the ends that asked for it would have one by one (256 each, in rounds of 256: `unpack` has a
-- limit), so that the outcomes are forgotten as fast as they are remembered; under pcall: a companion key of another
-- type refuses it without touching the ends, which are retired already. With a backlog of expired outcomes (after
-- an upgrade, say) a call of 64 ends that all ask forgets up to 16,384: tens of milliseconds, once.
if sweep_now then
  pcall(function()
    local now, window_ms, limit = sweep_now, sweep_window_ms, 256
    for _ = 1, sweeps do
      --#include expire_ended
      if #old < limit then
        break
      end
    end
  end)
end
return replies
