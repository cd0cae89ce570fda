"""PySpark Python Data Source ``redis-txmq`` that reads committed topic streams."""
