"""``txmq bench``: the measurements behind the performance goals (send rates against plain XADD, producer
processes, the checker at scale, memory per transaction). Results and the command that gave them: README.md here.

Modules: ``send`` (in-process interleaved rounds), ``processes`` (worker processes), ``checkback``,
``memory``, ``report`` (table, JSON, chart), ``run`` (the whole run with progress); ``spark_read`` is a separate
script for the Spark connector (``python -m bench.spark_read``).
"""
