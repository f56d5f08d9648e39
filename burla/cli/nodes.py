"""`burla nodes ...`: the machines of the cluster (JSON output)."""

from __future__ import annotations

import time

import click

from burla.cli.common import CliError, JsonGroup, emit_line, fail, head_client, run


@click.group(cls=JsonGroup)
def nodes() -> None:
    """The cluster's nodes: status, CPUs, what they run, their history."""


@nodes.command("list")
@click.pass_context
def list_nodes(ctx: click.Context) -> None:
    """Live nodes."""
    run("nodes list", lambda: head_client(ctx).get("/v1/cluster")["nodes"])


@nodes.command()
@click.argument("node_id")
@click.pass_context
def show(ctx: click.Context, node_id: str) -> None:
    """One node, with its recent events."""
    run("nodes show", lambda: head_client(ctx).get(f"/v1/nodes/{node_id}"))


@nodes.command()
@click.argument("node_id")
@click.option("--follow", is_flag=True, help="Keep streaming new events (NDJSON).")
@click.option("--interval", type=click.FloatRange(0.1, 60.0), default=1.0, show_default=True)
@click.pass_context
def logs(ctx: click.Context, node_id: str, follow: bool, interval: float) -> None:
    """A node's lifecycle events (registered, declared dead, removed...)."""
    if not follow:
        run("nodes logs", lambda: head_client(ctx).get(f"/v1/nodes/{node_id}/events"))
        return
    try:
        client = head_client(ctx)
        seen: set[tuple] = set()
        while True:
            events = client.get(f"/v1/nodes/{node_id}/events")["events"]
            for event in reversed(events):
                key = (event["at"], event["event"], event["detail"])
                if key not in seen:
                    seen.add(key)
                    emit_line("nodes logs", "event", event)
            time.sleep(interval)
    except CliError as e:
        fail("nodes logs", e)
    except KeyboardInterrupt:
        pass
