"""`burla usage`: node-hours per machine type and their estimated cost (JSON output)."""

from __future__ import annotations

import click

from burla.cli.common import head_client, run


@click.command()
@click.option("--since", "since_days", type=click.FloatRange(0.001, 3650), default=30.0, show_default=True,
              metavar="DAYS", help="How many days back to count.")
@click.pass_context
def usage(ctx: click.Context, since_days: float) -> None:
    """Node-hours per machine type and an estimated cost (on-demand list prices), from history."""
    run("usage", lambda: head_client(ctx).get("/v1/usage", since_days=since_days))
