"""`burla cluster ...`: status, start, stop, restart, watch."""

from __future__ import annotations

import time

import click

from burla.cli.common import CliError, JsonGroup, emit_line, fail, find_head_client, head_client, run
from burla.protocol.states import JobStatus
from burla.protocol.views import JobView


@click.group(cls=JsonGroup)
def cluster() -> None:
    """See and control the cluster's nodes (JSON output)."""


def _status(client) -> dict:
    state = client.get("/v1/cluster")
    return {
        "head_url": client.url,
        "version": state["version"],
        "booting": state["booting"],
        "nodes": state["nodes"],
        "running_jobs": sum(1 for j in state["jobs"] if JobView.from_json(j).status == JobStatus.RUNNING),
    }


@cluster.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Nodes, what they run, and the head's version."""
    run("cluster status", lambda: _status(head_client(ctx)))


@cluster.command()
@click.pass_context
def start(ctx: click.Context) -> None:
    """Boot the configured quantity of nodes (starting a local head first if none runs)."""

    def action() -> dict:
        client = find_head_client(ctx)
        started_head = client is None
        if client is None:
            from burla.client.api import get_cluster_dashboard_url

            get_cluster_dashboard_url()  # a background head with its local node
            client = head_client(ctx)
        stale = ctx.obj.get("stale_head") if ctx.obj else None
        return {"head_url": client.url, "started_head": started_head, **({"note": stale} if stale else {}),
                **client.post("/v1/cluster/start")}

    run("cluster start", action)


@cluster.command()
@click.pass_context
def stop(ctx: click.Context) -> None:
    """Cancel running jobs and stop every node; jobs wait for `cluster start` after this."""
    run("cluster stop", lambda: head_client(ctx).post("/v1/cluster/stop"))


@cluster.command()
@click.pass_context
def restart(ctx: click.Context) -> None:
    """Stop every node, then boot the configured quantity again."""
    run("cluster restart", lambda: head_client(ctx).post("/v1/cluster/restart"))


@cluster.command()
@click.option("--interval", type=click.FloatRange(0.1, 60.0), default=1.0, show_default=True)
@click.option("--count", type=click.IntRange(1, None), default=None, help="Stop after this many lines.")
@click.pass_context
def watch(ctx: click.Context, interval: float, count: int | None) -> None:
    """Stream the cluster's state as NDJSON: a snapshot first, then each change."""
    try:
        client = head_client(ctx)
        previous = None
        printed = 0
        while count is None or printed < count:
            current = _status(client)
            if current != previous:
                emit_line("cluster watch", "snapshot" if previous is None else "change", current)
                previous = current
                printed += 1
            if count is None or printed < count:
                time.sleep(interval)
    except CliError as e:
        fail("cluster watch", e)
    except KeyboardInterrupt:
        pass
