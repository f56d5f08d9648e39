"""The `burla` command: one program that runs as head, node or worker, and manages clusters.

Management commands (cluster, jobs, nodes, settings, config, auth) print one JSON document
(NDJSON for streams) and exit with a code that says what happened; see burla/cli/common.py.
"""

from __future__ import annotations

import importlib

import click

from burla._version import __version__
from burla.config import ENV_HEAD_URL, ENV_TOKEN

# Subcommands, imported only when they run: `burla head serve` and `burla node join` start on
# every cold start and need none of the management commands' imports.
_COMMANDS = {
    "auth": "burla.cli.account",
    "cluster": "burla.cli.cluster",
    "config": "burla.cli.account",
    "dashboard": "burla.cli.account",
    "deploy": "burla.cli.deploy",
    "head": "burla.cli.head",
    "jobs": "burla.cli.jobs",
    "node": "burla.cli.node",
    "nodes": "burla.cli.nodes",
    "settings": "burla.cli.settings",
    "worker": "burla.cli.worker",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(_COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        module = _COMMANDS.get(name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), name)
        self.add_command(command, name)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burla")
@click.option("--head", "head_url", envvar=ENV_HEAD_URL, default=None, metavar="URL",
              help="The cluster's head. Default: BURLA_CLUSTER_DASHBOARD_URL, else this machine's running head.")
@click.option("--token", envvar=ENV_TOKEN, default=None, help="Cluster token. Default: the config directory's.")
@click.pass_context
def main(ctx: click.Context, head_url: str | None, token: str | None) -> None:
    """Run Python functions on every CPU of a cluster, and see everything it does.

    Most users never need this command to run jobs: `remote_parallel_map` starts a local
    cluster by itself. Use it to watch and debug jobs (`burla jobs list`, `burla jobs errors
    JOB`), manage the cluster (`burla cluster status`), or run a head and nodes by hand
    (`burla head serve`, `burla node join`).
    """
    source = ctx.get_parameter_source("head_url")
    ctx.obj = {
        "head": head_url,
        "head_from_flag": source == click.core.ParameterSource.COMMANDLINE,
        "token": token,
        "token_from_flag": ctx.get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE,
    }

