"""`burla settings ...`: what `burla cluster start` boots (JSON output)."""

from __future__ import annotations

import click

from burla.cli.common import CliError, JsonGroup, head_client, run

RESETTABLE = ("quantity", "workers_per_node", "machine_type", "region", "disk_gb", "image", "inactivity_timeout_s",
              "spot", "max_vcpus", "max_gpus")


@click.group(cls=JsonGroup)
def settings() -> None:
    """Show or change the cluster settings (node quantity, machine type, region...)."""


@settings.command()
@click.pass_context
def show(ctx: click.Context) -> None:
    """The current cluster settings."""
    run("settings show", lambda: head_client(ctx).get("/v1/settings"))


def _gpu_caps(values: tuple[str, ...]) -> dict[str, int]:
    caps = {}
    for value in values:
        model, _, count = value.partition("=")
        if not model or not count.isdigit():
            raise CliError("bad_usage", f"--max-gpus takes MODEL=N, got {value!r}", "e.g. --max-gpus A100=8", 2)
        caps[model] = int(count)
    return caps


@settings.command()
@click.option("--quantity", type=int, help="Nodes `burla cluster start` boots.")
@click.option("--workers-per-node", type=int, help="Workers per node (default: one per CPU).")
@click.option("--machine-type", help="Machine type for cloud nodes, e.g. m7i.2xlarge.")
@click.option("--region", help="Region for new nodes.")
@click.option("--disk-gb", type=int, help="Boot disk size of new nodes.")
@click.option("--image", help="Container image new nodes run.")
@click.option("--inactivity-timeout", type=float, help="Seconds before an idle node is removed.")
@click.option("--spot/--no-spot", default=None, help="Boot spot (preemptible) machines.")
@click.option("--max-vcpus", type=int, help="Cap on vCPUs booted by grow=True.")
@click.option("--max-gpus", multiple=True, metavar="MODEL=N", help="Cap on GPUs of one model (repeatable).")
@click.option("--reset", multiple=True, type=click.Choice(RESETTABLE), metavar="SETTING",
              help=f"Put a setting back to its default (repeatable): {', '.join(RESETTABLE)}.")
@click.pass_context
def update(ctx: click.Context, quantity, workers_per_node, machine_type, region, disk_gb, image,
           inactivity_timeout, spot, max_vcpus, max_gpus, reset) -> None:
    """Change some settings, or reset them to their defaults; the rest stay as they are. Settings
    are kept in the head's history, so a head started later with the same config directory keeps them."""

    def action() -> dict:
        changes = {
            "quantity": quantity, "workers_per_node": workers_per_node, "machine_type": machine_type,
            "region": region, "disk_gb": disk_gb, "image": image, "inactivity_timeout_s": inactivity_timeout,
            "spot": spot, "max_vcpus": max_vcpus,
        }
        changes = {k: v for k, v in changes.items() if v is not None}
        if max_gpus:
            changes["max_gpus"] = _gpu_caps(max_gpus)
        both = sorted(set(changes) & set(reset))
        if both:
            raise CliError("bad_usage", f"{', '.join(both)} both set and reset", "pass one or the other", 2)
        if reset:
            changes["reset"] = list(reset)
        if not changes:
            raise CliError("bad_usage", "no setting to change", "pass at least one option; see --help", 2)
        return head_client(ctx).post("/v1/settings", changes)

    run("settings update", action)
