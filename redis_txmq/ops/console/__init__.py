"""The web console of ``txmq console``: ``app.create_app`` builds it, ``queries`` holds its reads.

Importing this package imports nothing of the web stack (the ``console`` extra): ``app`` does."""
