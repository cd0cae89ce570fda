"""The check-back worker (RocketMQ's TransactionalMessageCheckService), run as ``txmq checker``."""
