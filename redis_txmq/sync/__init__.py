"""The sync I/O shells, every module generated from its asyncio source in ``redis_txmq/asyncio/`` by
``scripts/unasync.py`` (CI fails when one is stale): edit the source, never these. The public names are
re-exported from ``redis_txmq``."""
