"""``txmq``: the command line, and the composition root (the only module that may import the workers)."""

from __future__ import annotations

import logging
import sys

import click
from rich.console import Console

from . import __version__
from .connection import redact_url

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    envvar="TXMQ_LOG_LEVEL",
    default="WARNING",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def main(log_level: str) -> None:
    """redis-txmq: transactional messages on Redis Streams."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(f"redis-txmq {__version__}")


@main.command()
@click.option(
    "--redis-url",
    envvar="TXMQ_REDIS_URL",
    default=None,
    help="Redis to use; without it the demo starts its own (redis-server, else fakeredis).",
)
def demo(redis_url: str | None) -> None:
    """Run the order-service story: commits, rollbacks, a consumer reading what was committed."""
    from .demo import run_demo
    from .embedded import EmbeddedRedis

    embedded: EmbeddedRedis | None = None
    if redis_url is None:
        embedded = EmbeddedRedis().start()
        redis_url = embedded.url
        console.print(f"[bold]Embedded Redis[/] ({embedded.kind}) at {redis_url}")
    else:
        console.print(f"[bold]Redis[/] at {redact_url(redis_url)}")
    try:
        outcome = run_demo(redis_url, console)
    finally:
        if embedded is not None:
            embedded.stop()
    if outcome.ok:
        console.print(
            f"[green]OK[/]: orders {outcome.committed} committed and consumed once each; "
            f"orders {outcome.rolled_back} rolled back and never seen."
        )
        return
    console.print(f"[red]FAILED[/]: committed {outcome.committed}, consumed {outcome.consumed}")
    sys.exit(1)


__all__ = ["main"]
