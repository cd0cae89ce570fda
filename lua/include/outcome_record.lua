-- fragment outcome_record: the remembered outcome of a transaction as `ended` holds it:
-- "<state>|<committed id or ->|<half id>|<producer group>" (read back by end_not_in_flight.lua, prepare_one.lua,
-- prepare_halves.lua and dead_resolve.lua). Inlined by the loader (lua/README.md) into: include/apply_outcome.lua
-- and end_transactions.lua.
-- Expects in scope: outcome, committed_id ('' for none), half_id, half (its fields, producer_group among them).
-- Defines: record. Commands: none.
local record = outcome .. '|' .. (committed_id ~= '' and committed_id or '-') .. '|' .. half_id .. '|'
  .. half['producer_group']
