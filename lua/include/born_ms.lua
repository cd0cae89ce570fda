-- fragment born_ms: the birth time of the half messages a prepare writes: the server's TIME in ms, never a client's
-- clock (clients' clocks skew), put together as text (a Lua number would go through printf and strtod on its way to
-- the XADD and the ZADD). Inlined by the loader (lua/README.md) into: include/prepare_one.lua (prepare_half.lua) and
-- prepare_halves.lua (once per call).
-- Expects in scope: born_ms, a local to set. Commands: TIME.
local time = redis.call('TIME')
born_ms = time[1] .. string.sub(string.rep('0', 6 - #time[2]) .. time[2], 1, 3)
