"""redis-txmq for asyncio services, mirroring the sync API the way ``redis.asyncio`` mirrors ``redis``."""
