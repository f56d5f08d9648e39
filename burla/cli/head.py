"""`burla head ...`: run the control plane of a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from burla._version import __version__
from burla.cli import global_option
from burla.cli.background_head import STOP_TIMEOUT_S
from burla.cli.common import vm_setup_options
from burla.cli.token_options import TOKEN_FILE_HELP, TOKEN_HELP, read_token_file, refuse_command_line_token
from burla.config import (
    HeadSettings,
    config_dir,
    load_or_create_token,
    read_token,
    write_private_file,
)
from burla.drivers.registry import DRIVER_NAMES


def _tunnel_program(tunnel_client: str) -> str | None:
    """The ssh program that carries the tunnels, or None for asyncssh in the head's process."""
    from burla.drivers.ssh.tunnel import find_ssh_program

    if tunnel_client == "asyncssh":
        return None
    program = find_ssh_program()
    if program is None and tunnel_client == "openssh":
        raise click.UsageError("--tunnel-client openssh: no ssh program on PATH; install OpenSSH's client "
                               "or pass --tunnel-client asyncssh")
    return program


def _driver_name(chosen: str | None) -> str:
    """--driver, else the cloud `burla config set cloud` chose, else the one cloud signed in here."""
    import os

    from burla.config import ENV_CLOUD, read_client_config
    from burla.drivers.registry import resolve_driver
    from burla.errors import CloudSetupError

    configured = os.environ.get(ENV_CLOUD) or read_client_config(config_dir()).get("cloud")
    try:
        return resolve_driver(chosen, configured if isinstance(configured, str) else None, dict(os.environ))
    except CloudSetupError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def _cloud_config(driver: str, region: str | None, token: str):
    if driver == "local":
        return None
    import os

    from burla.drivers.registry import cloud_config, cluster_id_of
    from burla.errors import CloudSetupError

    try:
        return cloud_config(driver, dict(os.environ), region, cluster_id_of(token))
    except CloudSetupError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def _tls_files(directory: Path, host: str, public_url: str | None, cert: Path | None, key: Path | None,
               self_signed: bool) -> tuple[Path | None, Path | None]:
    """The certificate and key to serve with, if any (made here for --tls-self-signed)."""
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if self_signed and cert is not None:
        raise click.UsageError("pass either --tls-self-signed or --tls-cert/--tls-key, not both")
    if public_url is not None and not public_url.startswith(("http://", "https://")):
        raise click.UsageError(f"--url must start with http:// or https://, got {public_url!r}")
    from burla.errors import TlsSetupError
    from burla.web.tls import make_self_signed, server_context

    if not self_signed:
        if cert is not None and key is not None:
            try:
                server_context(cert, key)  # fail here, with the reason, rather than once serving
            except TlsSetupError as e:
                click.echo(f"error: {e}", err=True)
                sys.exit(2)
        return cert, key
    import urllib.parse

    names = [host] if host not in ("0.0.0.0", "::") else []
    if public_url:
        names.append(urllib.parse.urlsplit(public_url.replace("{port}", "1")).hostname or "")
    names = [n for n in names + ["127.0.0.1", "localhost"] if n]
    try:
        cert, key = make_self_signed(names, directory)
    except TlsSetupError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(f"serving https with a self-signed certificate; clients and nodes trust it with "
               f"BURLA_HEAD_CERT={cert}", err=True)
    return cert, key


@click.group()
def head() -> None:
    """Run a cluster head (the control plane every client and node talks to)."""


@head.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port to listen on (0 picks a free one). Default: 5001 if free, else any free port.")
@click.option("--local-nodes", type=click.IntRange(0, 64), default=0, show_default=True,
              help="Start this many nodes on this machine (the local driver).")
@click.option("--local-node-workers", type=click.IntRange(1, 4096), default=None,
              help="Workers per local node. Default: one per CPU.")
@click.option("--token", default=None, callback=refuse_command_line_token, metavar="(refused)",
              help=f"{TOKEN_HELP} Default: the one in the config directory, created if missing.")
@click.option("--token-file", default=None, metavar="FILE", callback=read_token_file, help=TOKEN_FILE_HELP)
@click.option("--node-deadline", type=click.FloatRange(1.0, 3600.0), default=30.0, show_default=True,
              help="Seconds a node may stay silent before it is dropped.")
@click.option("--client-deadline", type=click.FloatRange(0.5, 3600.0), default=10.0, show_default=True,
              help="Seconds a job waits for its disconnected client to come back before it is cancelled.")
@click.option("--inactivity-timeout", type=click.FloatRange(1.0, None), default=None,
              help="Remove nodes idle this many seconds (local nodes start again with the next job). "
                   "Default: keep them.")
@click.option("--history", "history_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite file for job, call and node history. Default: history.db in the config directory.")
@click.option("--no-history", is_flag=True, help="Keep no history (the dashboard and CLI then show live state only).")
@click.option("--history-retention-days", type=click.FloatRange(0.01, None), default=30.0, show_default=True,
              help="Delete history older than this.")
@click.option("--driver", type=click.Choice(DRIVER_NAMES), default=None,
              help="Where `burla cluster start` and grow=True boot nodes: this machine, or VMs in your AWS (ec2), "
                   "Google Cloud (gce) or Azure account. Default: the cloud `burla config set cloud` chose, else "
                   "the one cloud this machine is signed in to, else this machine.")
@click.option("--keep-nodes", is_flag=True,
              help="Leave this cluster's cloud VMs running when the head stops (they power off once they have "
                   "been without a head for --orphan-timeout). Default: the head deletes them as it stops.")
@click.option("--node-link", type=click.Choice(["tunnel", "direct"]), default="tunnel", show_default=True,
              help="How cloud nodes reach this head: through a port forward on the head's SSH connection to "
                   "their VM (a laptop, a head behind NAT), or directly at --url (a head inside the cloud network).")
@click.option("--tunnel-client", type=click.Choice(["auto", "openssh", "asyncssh"]), default="auto",
              show_default=True,
              help="What carries the tunnels: OpenSSH's ssh client, a process per VM (faster, and off the head's "
                   "own core), or asyncssh in the head's process. auto: ssh if this machine has it.")
@click.option("--orphan-timeout", type=click.FloatRange(10.0, None), default=600.0, show_default=True,
              help="Seconds a cloud node may be without its head before it powers its VM off.")
@vm_setup_options
@click.option("--region", default=None,
              help="Cloud region for nodes. Default: the cloud CLI's (AWS_REGION, gcloud compute/region, "
                   "AZURE_DEFAULTS_LOCATION).")
@click.option("--boot-deadline", type=click.FloatRange(1.0, None), default=900.0, show_default=True,
              help="Seconds a booting node may take to register before it is deleted (its console kept).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Serve https with this certificate (PEM); needs --tls-key.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The private key of --tls-cert (PEM).")
@click.option("--tls-self-signed", is_flag=True,
              help="Serve https with a certificate made for --host / --url (kept in the config directory); "
                   "clients and nodes pin it through BURLA_HEAD_CERT.")
@click.option("--no-tls", is_flag=True,
              help="Serve plain http even on a non-loopback address (only behind a TLS proxy of your own).")
@click.option("--url", "public_url", default=None,
              help="The URL clients and nodes reach this head at, when it differs from --host (e.g. "
                   "https://10.0.0.5:{port}; {port} is the bound port).")
@click.option("--header-timeout", type=click.FloatRange(0.1, 3600.0), default=30.0, show_default=True,
              help="Seconds a connection may take to send a complete request head, and may stay idle between "
                   "requests; slower connections are closed.")
@click.option("--max-open-jobs", type=click.IntRange(1, 1_000_000), default=4096, show_default=True,
              help="Jobs running at once; more are refused with a message naming this limit.")
@click.option("--max-client-connections", type=click.IntRange(1, 1_000_000), default=4096, show_default=True,
              help="Job connections open at once per credential; more are refused (429).")
@click.option("--max-tree-jobs", type=click.IntRange(1, 1_000_000), default=256, show_default=True,
              help="Jobs open at once nested under one top-level job (opened by its calls); more are refused (429).")
@click.option("--max-tree-mb", type=click.IntRange(1, 1_000_000), default=512, show_default=True,
              help="MB the nested jobs of one top-level job may hold on the head (functions, local code, queued "
                   "inputs); past it a new one is refused (429).")
@click.option("--ephemeral", is_flag=True, hidden=True, help="Don't advertise this head to other clients.")
@click.option("--ready-fd", type=int, default=None, hidden=True)
@click.option("--lifeline-fd", type=int, default=None, hidden=True)
@click.pass_context
def serve(ctx: click.Context, host: str, port: int | None, local_nodes: int, local_node_workers: int | None,
          token: str | None, token_file: str | None, node_deadline: float, client_deadline: float,
          inactivity_timeout: float | None,
          history_path: Path | None, no_history: bool, history_retention_days: float, driver: str | None,
          keep_nodes: bool, node_link: str, tunnel_client: str, orphan_timeout: float, node_index_url: str | None,
          node_wheelhouse: Path | None, ssh_address_map: Path | None, region: str | None, boot_deadline: float,
          tls_cert: Path | None, tls_key: Path | None, tls_self_signed: bool, no_tls: bool, public_url: str | None,
          header_timeout: float, max_open_jobs: int, max_client_connections: int, max_tree_jobs: int,
          max_tree_mb: int,
          ephemeral: bool, ready_fd: int | None, lifeline_fd: int | None) -> None:
    """Serve a head and print its URL; runs until Ctrl-C or SIGTERM."""
    from burla.head.server import PortInUse
    from burla.head.server import serve as run_head

    if (ctx.find_root().obj or {}).get("head_from_flag"):
        raise click.UsageError("`burla head serve` runs a head: --head names one to talk to, and means nothing here. "
                               "For the address this head gives its nodes and clients, use --url.")
    directory = config_dir()
    token = token_file or token or global_option(ctx, "token")
    driver = _driver_name(driver)
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if node_link == "direct" and driver != "local" and loopback and public_url is None:
        raise click.UsageError("--node-link direct needs a head cloud VMs can reach: listen on their network "
                               "(--host 0.0.0.0, --url https://PRIVATE-ADDRESS:{port}) or keep the default tunnel")
    tunnel_program = _tunnel_program(tunnel_client)
    if no_tls and (tls_cert or tls_self_signed):
        raise click.UsageError("--no-tls contradicts --tls-cert / --tls-self-signed")
    if not loopback and tls_cert is None and not no_tls:
        tls_self_signed = True  # a head other machines reach serves https (DESIGN §6)
    tls_cert, tls_key = _tls_files(directory, host, public_url, tls_cert, tls_key, tls_self_signed)
    if not loopback and no_tls:
        click.echo(f"warning: listening on {host} without TLS (--no-tls); anyone who can reach it sees the token "
                   "in transit unless your proxy adds TLS.", err=True)
    if token:
        if not ephemeral and read_token(directory) != token:
            write_private_file(directory / "cluster_token", token + "\n")
    else:
        token = load_or_create_token(directory)
    settings = HeadSettings(
        host=host, port=port, token=token, config_dir=directory, local_nodes=local_nodes,
        local_node_workers=local_node_workers, advertise=not ephemeral, ready_fd=ready_fd,
        lifeline_fd=lifeline_fd, node_deadline_s=node_deadline, client_deadline_s=client_deadline,
        inactivity_timeout_s=inactivity_timeout,
        history_path=None if no_history else history_path or directory / "history.db",
        history_retention_days=history_retention_days,
        cloud=_cloud_config(driver, region, token), boot_deadline_s=boot_deadline,
        tls_cert=tls_cert, tls_key=tls_key, public_url=public_url,
        version=__version__, keep_nodes=keep_nodes, node_link=node_link, orphan_timeout_s=orphan_timeout,
        node_index_url=node_index_url, node_wheelhouse=node_wheelhouse, ssh_address_map=ssh_address_map,
        tunnel_program=tunnel_program, header_timeout_s=header_timeout, max_open_jobs=max_open_jobs,
        max_client_connections=max_client_connections, max_tree_jobs=max_tree_jobs, max_tree_mb=max_tree_mb,
    )
    try:
        run_head(settings)
    except PortInUse as e:
        click.echo(f"error: {e}. Pass --port 0 for any free port, or stop what uses it.", err=True)
        sys.exit(5)


@head.command()
@click.option("--timeout", type=click.FloatRange(1.0, None), default=STOP_TIMEOUT_S, show_default=True,
              help="Seconds to wait for it to exit (it deletes its VMs first).")
@click.option("--force", is_flag=True, help="Kill it if it has not exited by then.")
def stop(timeout: float, force: bool) -> None:
    """Stop this machine's background head (the one clients and `burla cluster start` started):
    its jobs end, its local nodes stop and its VMs are deleted, as on SIGTERM. JSON output."""
    from burla.cli.background_head import stop_head
    from burla.cli.common import run

    run("head stop", lambda: stop_head(config_dir(), timeout, force))


@head.command(hidden=True, context_settings={"ignore_unknown_options": True})
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def supervise(serve_args: tuple[str, ...]) -> None:
    """Run `burla head serve SERVE_ARGS`, starting it again whenever it exits (a deployed head on
    an image without systemd)."""
    from burla.process.supervisor import supervise_head

    sys.exit(supervise_head(tuple(serve_args)))
