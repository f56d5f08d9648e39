"""`burla node ...`: run a node that executes calls for a head."""

from __future__ import annotations

import sys

import click

from burla.cli import global_option
from burla.cli.token_options import TOKEN_FILE_HELP, TOKEN_HELP, read_token_file, refuse_command_line_token
from burla.config import ENV_HEAD_CERT, ENV_HEAD_URL, config_dir, read_token


@click.group()
def node() -> None:
    """Run a node (one per machine) that joins a head and runs calls on its workers."""


@node.command()
@click.option("--head", "head_url", envvar=ENV_HEAD_URL, default=None,
              help="The head's URL, e.g. http://127.0.0.1:5001 (required, here or as `burla --head URL node join`).")
@click.option("--token", default=None, callback=refuse_command_line_token, metavar="(refused)",
              help=f"{TOKEN_HELP} Default: the one in the config directory.")
@click.option("--token-file", default=None, metavar="FILE", callback=read_token_file, help=TOKEN_FILE_HELP)
@click.option("--workers", type=click.IntRange(1, 4096), default=None, help="Worker processes. Default: one per CPU.")
@click.option("--node-id", default=None, help="This node's name. Default: a random one.")
@click.option("--region", default="local", show_default=True, help="Region this node reports.")
@click.option("--image", default=None, help="Container image this node reports running.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address this node's HTTP endpoint listens on; 0.0.0.0 for peers on other machines (it then "
                   "advertises the address it reaches the head from).")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port of this node's HTTP endpoint (peers steal work through it); 0 picks a free one.")
@click.option("--advertise-url", default=None,
              help="URL peers should use to reach this node, when not http://127.0.0.1:PORT (a proxy, NAT).")
@click.option("--advertise-host", default=None,
              help="Address peers reach this node at (its private address on the cluster's network); the URL "
                   "is http://ADDRESS:PORT with the bound port.")
@click.option("--orphan-timeout", type=click.FloatRange(1.0, None), default=60.0, show_default=True,
              help="Seconds without reaching the head before this node gives up and exits (code 6).")
@click.option("--steal-ack-timeout", type=click.FloatRange(0.1, 600.0), default=5.0, show_default=True,
              help="Seconds before inputs given to a peer that never acknowledged them run here instead.")
@click.option("--memory-limit-gb", type=click.FloatRange(0.05, None), default=None,
              help="Memory all workers together may use. Default: 90% of this machine's memory.")
@click.option("--gpu", default=None,
              help="GPU model this node offers, e.g. A100_40G. Default: what nvidia-smi lists, if anything.")
@click.option("--gpu-count", type=click.IntRange(0, 64), default=0,
              help="How many GPUs it offers. Default: as many as nvidia-smi lists (1 with --gpu and no nvidia-smi).")
@click.option("--head-cert", type=click.Path(exists=True, dir_okay=False), envvar=ENV_HEAD_CERT, default=None,
              help="The head's own certificate, for an https head with a self-signed one (pinned).")
@click.option("--allow-source-builds", is_flag=True,
              help="Let this node build packages from source distributions when it replicates a client's packages "
                   "(a build runs the package's code). Default: wheels only.")
@click.option("--head-url-file", default=None, hidden=True,
              help="A file holding the head's URL, read again before each connection (a moved SSH tunnel).")
@click.option("--lifeline-fd", type=int, default=None, hidden=True)
@click.pass_context
def join(ctx: click.Context, head_url: str | None, token: str | None, token_file: str | None, workers: int | None,
         node_id: str | None,
         region: str,
         image: str | None, host: str, port: int, advertise_url: str | None, advertise_host: str | None,
         orphan_timeout: float, steal_ack_timeout: float,
         memory_limit_gb: float | None, gpu: str | None, gpu_count: int, head_cert: str | None,
         allow_source_builds: bool, head_url_file: str | None, lifeline_fd: int | None) -> None:
    """Register with a head and serve calls until stopped."""
    from burla.node.main import node_settings, run_node

    head_url = head_url or global_option(ctx, "head")
    if not head_url:
        raise click.UsageError("Missing option '--head': the head's URL, e.g. --head http://127.0.0.1:5001.")
    token = token_file or token or global_option(ctx, "token") or read_token(config_dir())
    if not token:
        click.echo("error: no cluster token. Set BURLA_CLUSTER_TOKEN or pass --token-file FILE (the head prints "
                   "where its token is stored).", err=True)
        sys.exit(3)
    settings = node_settings(
        head_url, token, workers=workers, node_id=node_id, region=region, image=image, host=host, port=port,
        advertise_url=advertise_url, advertise_host=advertise_host, orphan_timeout=orphan_timeout,
        steal_ack_timeout=steal_ack_timeout, memory_limit_gb=memory_limit_gb, gpu=gpu, gpu_count=gpu_count,
        head_cert=head_cert, head_url_file=head_url_file, lifeline_fd=lifeline_fd,
        source_builds=allow_source_builds,
    )
    sys.exit(run_node(settings))


@node.command(hidden=True, context_settings={"ignore_unknown_options": True})
@click.option("--orphan-timeout", type=click.FloatRange(1.0, None), default=600.0, show_default=True,
              help="Power the machine off after the node kept crashing this long.")
@click.option("--image", default=None, help="Run the node inside this container image.")
@click.option("--gpus", is_flag=True, help="Give the container every GPU.")
@click.argument("join_args", nargs=-1, type=click.UNPROCESSED)
def supervise(orphan_timeout: float, image: str | None, gpus: bool, join_args: tuple[str, ...]) -> None:
    """Run `burla node join JOIN_ARGS` on a cloud VM: restart it when it crashes, power the VM off
    when the node is done (its head gone past the orphan timeout, refused, or stopped)."""
    from burla.process.supervisor import SupervisorSettings, supervise_node

    sys.exit(supervise_node(SupervisorSettings(tuple(join_args), orphan_timeout, image, gpus)))
