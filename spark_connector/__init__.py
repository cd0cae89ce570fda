"""PySpark Python Data Source ``redis-txmq``: reads committed topic streams, batch and Structured Streaming.

import redis_txmq.spark
redis_txmq.spark.register(spark)
spark.read.format("redis-txmq").option("redis.url", url).option("topics", "orders").load()
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from .options import SparkSourceError
from .source import SCHEMA, RedisTxmqDataSource

logger = logging.getLogger(__name__)

SPARK_DEFAULT_WORKER_PYTHON = "python3"
"""What a SparkContext runs its Python workers with when ``PYSPARK_PYTHON`` was not set before it started."""


def register(spark: Any) -> None:
    """Register the ``redis-txmq`` format on a SparkSession.

    The source is planned and read in Spark's Python workers, which need pyarrow and redis-txmq. Without
    ``PYSPARK_PYTHON`` Spark starts them with whatever ``python3`` is on PATH, so a plain script run with a virtualenv's
    interpreter fails; see ``use_driver_python_for_local_workers``."""
    use_driver_python_for_local_workers(spark)
    spark.dataSource.register(RedisTxmqDataSource)


def use_driver_python_for_local_workers(spark: Any) -> str | None:
    """Point the Python workers of a local-mode session at the interpreter chosen for them, else at this one.

    Only when nobody chose already: ``PYSPARK_PYTHON`` set, or the context's interpreter changed, wins. A
    ``spark.pyspark.python`` conf (which PySpark itself reads only under spark-submit) is honoured. Without it, a
    ``local`` / ``local-cluster`` master gets ``sys.executable``: its workers run on this machine, and must match
    the driver's Python version anyway. Other masters are left alone: this interpreter's path may not exist on the
    executors. Spark Connect sessions are left alone too: their workers run on the server. Returns the interpreter
    set, or None when nothing was changed."""
    if os.environ.get("PYSPARK_PYTHON") or type(spark).__module__.startswith("pyspark.sql.connect"):
        return None
    context = spark.sparkContext
    if context.pythonExec != SPARK_DEFAULT_WORKER_PYTHON:
        return None
    chosen = context.getConf().get("spark.pyspark.python")
    if not chosen:
        if not context.master.startswith("local"):
            logger.info(
                "master %s: Spark's Python workers run %r from the executors' PATH; it needs pyarrow and redis-txmq "
                "(set PYSPARK_PYTHON or spark.pyspark.python otherwise)",
                context.master,
                SPARK_DEFAULT_WORKER_PYTHON,
            )
            return None
        chosen = sys.executable
    context.pythonExec = chosen
    logger.info("Spark's Python workers will run %s (PYSPARK_PYTHON was not set)", chosen)
    return chosen


__all__ = ["SCHEMA", "RedisTxmqDataSource", "SparkSourceError", "register", "use_driver_python_for_local_workers"]
