"""The `burla` command: one program that runs as head, node or worker by subcommand."""

from __future__ import annotations

import click

from burla._version import __version__
from burla.cli.head import head
from burla.cli.node import node
from burla.cli.worker import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burla")
def main() -> None:
    """Run Python functions on every CPU of a cluster.

    Most users never need this command: `remote_parallel_map` starts a local cluster by
    itself. Use `burla head serve` and `burla node join` to run a cluster by hand.
    """


main.add_command(head)
main.add_command(node)
main.add_command(worker)
