-- fragment end_one: one end of a transaction, with every rule of lua/end_transaction.lua (SPEC §4.4): its arguments
-- checked, a repeat answered from the remembered outcome, the half message read and matched, then the outcome
-- applied (apply_outcome) and the half message retired (retire_half). Inlined by the loader (lua/README.md) into
-- end_transaction.lua (one end per call, at the script's top level). end_transactions.lua (many ends of one topic
-- partition per call) runs the same fragments for each end but the two that touch the indexes, whose reads and
-- writes it makes once for the call.
-- Expects in scope: the topic keys (topic_keys.lua);
--   at   the offset of this end's arguments in ARGV: ARGV[at + 1] .. ARGV[at + 8] are end_transaction's
--        ARGV[1] .. ARGV[8] (transaction_id, producer_group, outcome, source, remark, dedupe_window_ms,
--        op_stream_maxlen, half_id)
-- Returns the end's reply (end_transaction.lua's header), from the script or the function it is inlined in; every
-- path returns.
-- Commands: nine on the common path (a COMMIT of a never-checked transaction), see apply_outcome and retire_half.
local known = nil  -- one end: no numbers of an earlier end (end_args.lua)
--#include end_args

local half_id = redis.call('HGET', inflight, txid)
if not half_id then
  local prior = redis.call('HGET', ended, txid)
  --#include end_not_in_flight
end
local read_ahead = {}
--#include read_half

-- Outcome first, retire after: a write that fails part-way must not lose the half message. apply_outcome returns
-- the reply, having written nothing, when the topic stream refuses the message.
--#include apply_outcome

-- A never-checked transaction's remark (if any) goes with its remembered outcome when the window passes.
local keep_remark = window_ms > 0
--#include retire_half
return {'OK', outcome, half_id, committed_id, 'APPLIED', request_id}
