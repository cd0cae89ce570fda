"""How the shells reach Redis: clients made from a URL (``connection``), Sentinel URLs (``sentinel``), a throwaway
server (``embedded``), the sync send path's own connection per thread (``direct``, hand-written: it has no asyncio
twin), and the primitives in which an asyncio shell and its generated sync twin differ (``synchronization``)."""
