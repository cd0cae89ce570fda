"""The check-back worker (RocketMQ's TransactionalMessageCheckService), run as ``txmq checker``."""

from .metrics import CheckerMetrics
from .worker import Checker, RoundStats

__all__ = ["Checker", "CheckerMetrics", "RoundStats"]
