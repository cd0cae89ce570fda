"""The app's configuration: label ``txmq`` (its migrations and tables: ``txmq_transaction_log``, ``txmq_inbox``)."""

from django.apps import AppConfig


class TxMQConfig(AppConfig):
    name = "redis_txmq.django"
    label = "txmq"
    verbose_name = "redis-txmq"
