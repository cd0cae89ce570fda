"""``manage.py txmq_consume TOPIC --group GROUP --handler dotted.path``: the consuming side of a Django service.

Reads ``TOPIC`` through the consumer group ``GROUP`` and applies each message through the inbox
([`redis_txmq.django.Inbox`][redis_txmq.django.inbox.Inbox]): the function named by ``--handler`` is called with the
message inside ``transaction.atomic()`` together with the inbox row, and the message is acked after the commit. A
redelivered message (this process died between the commit and the ack) is acked without calling the handler again.

Stops on SIGTERM (what an orchestrator sends first) once the message in hand is handled, handing the rest of its
batch back to the group for another consumer to take at once: a stop takes one handler's time, not a batch's. On
SIGINT (Ctrl-C) at once: the message in hand is rolled back and redelivered. Also stops after ``--max-messages``.
"""

from __future__ import annotations

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from ...inbox import Inbox


class Command(BaseCommand):
    help = "Consume a topic through a consumer group, applying each message once through the inbox."

    default_topic: str | None = None
    default_group: str | None = None
    default_handler: str | None = None
    """Defaults for a project's own command: subclass this one and set them (``manage.py bill_orders``)."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("topic", nargs="?" if self.default_topic else None, default=self.default_topic)
        parser.add_argument("--group", default=self.default_group, required=self.default_group is None)
        parser.add_argument(
            "--handler",
            default=self.default_handler,
            required=self.default_handler is None,
            help="dotted path of a function(message) applying a message with the ORM (run inside the transaction)",
        )
        parser.add_argument(
            "--redis-url",
            default=getattr(settings, "TXMQ_REDIS_URL", None),
            help="default: settings.TXMQ_REDIS_URL, else the TXMQ_REDIS_URL environment variable",
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="the database alias of the inbox and handler")
        parser.add_argument("--max-messages", type=int, default=None, help="stop after this many (default: run on)")
        parser.add_argument("--block", type=float, default=None, help="seconds a read waits for new messages")
        parser.add_argument("--batch-size", type=int, default=None, help="messages read at a time (default: 16)")
        parser.add_argument(
            "--min-idle-time",
            type=float,
            default=None,
            help="seconds a message of a consumer that died (or of this one, unacked) waits before it is taken over",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from redis_txmq import Consumer

        try:
            apply = import_string(options["handler"])
        except ImportError as exc:
            raise CommandError(f"--handler {options['handler']!r}: {exc}") from exc
        chosen = ("block", "batch_size", "min_idle_time")
        consumer_options = {name: options[name] for name in chosen if options[name] is not None}
        inbox = Inbox(using=options["database"])
        handler = inbox.handler(apply, consumer_group=options["group"])
        with Consumer(
            options["topic"], options["group"], redis_url=options["redis_url"], **consumer_options
        ) as consumer:
            previous = signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
            try:
                handled = consumer.run(handler, max_messages=options["max_messages"])
            except KeyboardInterrupt:
                handled = None
            finally:
                signal.signal(signal.SIGTERM, previous)
        if handled is not None:
            self.stdout.write(f"{options['topic']}: {handled} message(s) handled by group {options['group']}")
