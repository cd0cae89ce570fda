-- fragment outcome_numbers: an outcome's dedupe window and op stream cap checked in the form a NaN fails (every
-- comparison with it is false): the numbers reach a ZADD and the op record's XADD after the topic entry, where a
-- refusal would leave the message published and the transaction in flight (published again by a retry). Inlined by
-- the loader (lua/README.md) into: include/end_args.lua (end_transaction.lua, end_transactions.lua) and
-- dead_resolve.lua.
-- Expects in scope: window_ms, op_maxlen (tonumber's: a number or nil).
-- Defines: numbers_refused, the BADARG detail when they cannot be written, else nil. Commands: none.
local numbers_refused = nil
if not (window_ms and window_ms >= 0 and window_ms <= 9007199254740992 and op_maxlen and op_maxlen >= 1
        and op_maxlen <= 9007199254740992 and op_maxlen == math.floor(op_maxlen)) then
  numbers_refused = 'dedupe_window_ms must be a number from 0 to 2^53 and op_stream_maxlen a whole number from 1 to '
                    .. '2^53'
end
