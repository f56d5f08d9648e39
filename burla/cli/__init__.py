"""The `burla` command: one program that runs as head, node or worker, and manages clusters.

Management commands (cluster, jobs, nodes, settings, config, auth) print one JSON document
(NDJSON for streams) and exit with a code that says what happened; see burla/cli/common.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import click

from burla._version import __version__
from burla.cli.token_options import (
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    read_token_file,
    refuse_command_line_token,
    refuse_token_value,
)
from burla.config import ENV_HEAD_URL

# Subcommands, imported only when they run: `burla head serve` and `burla node join` start on
# every cold start and need none of the management commands' imports.
_COMMANDS = {
    "auth": "burla.cli.account",
    "cloud": "burla.cli.cloud",
    "cluster": "burla.cli.cluster",
    "config": "burla.cli.account",
    "dashboard": "burla.cli.account",
    "deploy": "burla.cli.deploy",
    "head": "burla.cli.head",
    "jobs": "burla.cli.jobs",
    "node": "burla.cli.node",
    "nodes": "burla.cli.nodes",
    "settings": "burla.cli.settings",
    "usage": "burla.cli.usage",
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
        accept_global_options(command)
        self.add_command(command, name)
        return command


def _keep_global(key: str, read: Callable[[click.Context, click.Parameter, str | None], str | None] | None = None
                 ) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def keep(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if read is not None:
            value = read(ctx, param, value)
        if value is not None:
            root = ctx.find_root()
            root.obj[key] = value
            root.obj[f"{key}_from_flag"] = True
    return keep


def accept_global_options(command: click.Command) -> None:
    """Let `--head` and `--token` follow any subcommand (`burla jobs list --head URL`) with the
    same meaning as before it. Commands with options of those names (`node join`, `head serve`)
    keep theirs and fall back to the ones given before the subcommand (`global_option`)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            accept_global_options(sub)
    flags = {flag for param in command.params for flag in getattr(param, "opts", ())}
    if "--head" not in flags:
        command.params.append(click.Option(
            ["--head", "_global_head"], metavar="URL", expose_value=False, callback=_keep_global("head"),
            help="The cluster's head, as in `burla --head URL ...`."))
    if "--token" not in flags:
        command.params.append(click.Option(
            ["--token", "_global_token"], expose_value=False, hidden=True,
            callback=refuse_token_value))
    if "--token-file" not in flags:
        command.params.append(click.Option(
            ["--token-file", "_global_token_file"], expose_value=False, metavar="FILE",
            callback=_keep_global("token", read_token_file), help=TOKEN_FILE_HELP))


def global_option(ctx: click.Context, key: str) -> str | None:
    """`--head` or `--token` as given before the subcommand (or from its environment variable)."""
    obj = ctx.find_root().obj
    return obj.get(key) if obj else None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burla")
@click.option("--head", "head_url", envvar=ENV_HEAD_URL, default=None, metavar="URL",
              help="The cluster's head. Default: BURLA_CLUSTER_DASHBOARD_URL, else this machine's running head.")
@click.option("--token", default=None, callback=refuse_command_line_token, metavar="(refused)",
              help=f"{TOKEN_HELP} Default: the config directory's.")
@click.option("--token-file", default=None, metavar="FILE", callback=read_token_file, help=TOKEN_FILE_HELP)
@click.pass_context
def main(ctx: click.Context, head_url: str | None, token: str | None, token_file: str | None) -> None:
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
        "token": token_file or token,
        "token_from_flag": token_file is not None,
    }

