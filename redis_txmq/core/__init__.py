"""The protocol without I/O: the message model, the settings, the errors, the key layout, the fields of entries, the
transaction's states, the scripts' arguments and replies, and the steps of a send, a check-back and a consumer.

Nothing here opens a connection: the shells (``redis_txmq.asyncio``, ``redis_txmq.sync``) do the I/O between these
steps, and the few helpers here that run a command take the caller's client. Imports only the standard library,
redis-py's types and itself."""
