"""A text key compared exactly on every database, as ``redis_txmq.sqlalchemy.statements.Key`` is."""

from __future__ import annotations

from typing import Any

from django.db import models


class KeyField(models.CharField):  # type: ignore[type-arg]
    """A ``CharField`` whose values are compared exactly (case, accents, trailing spaces): ``VARBINARY`` holding
    the UTF-8 bytes on MySQL / MariaDB, whose ``VARCHAR`` takes the server's collation (``utf8mb4_general_ci``:
    ``billing`` and ``Billing`` would be one consumer group, the fence of ``tx-a`` would find ``tx-A``'s row); the
    plain ``VARCHAR`` elsewhere, whose default collations already compare exactly."""

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "mysql":
            return f"varbinary({4 * int(self.max_length or 0)})"  # room for max_length characters of 4 bytes
        return super().db_type(connection)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        value = super().get_db_prep_value(value, connection, prepared)
        if isinstance(value, str) and connection.vendor == "mysql":
            return value.encode("utf-8")
        return value

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).decode("utf-8")
        return value
