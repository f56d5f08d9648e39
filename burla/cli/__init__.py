"""The `burla` command: one program that runs as head, node or worker, and manages clusters.

Management commands (cluster, jobs, nodes, settings, config, auth) print one JSON document
(NDJSON for streams) and exit with a code that says what happened; see burla/cli/common.py.
"""

from __future__ import annotations

import click

from burla._version import __version__
from burla.cli.account import auth, config, dashboard
from burla.cli.cluster import cluster
from burla.cli.deploy import deploy
from burla.cli.head import head
from burla.cli.jobs import jobs
from burla.cli.node import node
from burla.cli.nodes import nodes
from burla.cli.settings import settings
from burla.cli.worker import worker
from burla.config import ENV_HEAD_URL, ENV_TOKEN


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (cluster, jobs, nodes, settings, config, auth, dashboard, deploy, head, node, worker):
    main.add_command(command)
