"""PySpark Python Data Source ``redis-txmq``: reads committed topic streams, batch and Structured Streaming.

import spark_connector
spark_connector.register(spark)
spark.read.format("redis-txmq").option("redis.url", url).option("topics", "orders").load()
"""

from __future__ import annotations

from typing import Any

from .options import SparkSourceError
from .source import SCHEMA, RedisTxmqDataSource


def register(spark: Any) -> None:
    """Register the ``redis-txmq`` format on a SparkSession."""
    spark.dataSource.register(RedisTxmqDataSource)


__all__ = ["SCHEMA", "RedisTxmqDataSource", "SparkSourceError", "register"]
