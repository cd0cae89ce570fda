"""The operator's tools: a deployment's status and its dead letters (``admin``, shared by ``txmq status`` and
``txmq dead``), least-privilege ACL rules (``acl``) and the demo (``demo``). The command line itself is
``redis_txmq.cli``, the composition root."""
