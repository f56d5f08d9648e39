"""`burla cloud check`: before the first VM boots, what this machine's cloud account allows; and
`burla cloud machines`: the machine types grow picks from, as the region lists them; `burla cloud
images list|delete`: the baked images of the node runtime in the account.

One line per check (credentials, machine type, image, network, permissions, vCPU quota, SSH
path) with the fix for any that fails; `--json` prints the CLI's usual JSON document instead.
Exit code 0 when nothing failed, 9 when a check failed (booting would fail), 2 for bad usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Awaitable
from typing import TypeVar

import click

from burla.cli.common import EXIT_CLOUD, EXIT_NOT_FOUND, EXIT_USAGE, CliError, JsonGroup, fail
from burla.config import config_dir, read_client_config
from burla.drivers.base import CloudCheck, Driver
from burla.drivers.machine_catalog import RegionCatalog, region_catalog
from burla.drivers.registry import CLOUDS, LOCAL, cloud_config, cloud_driver, for_cloud, resolve_driver
from burla.errors import CloudSetupError

T = TypeVar("T")


@click.group(cls=JsonGroup)
def cloud() -> None:
    """This machine's cloud account, as burla will use it."""


@cloud.command()
@click.option("--cloud", "cloud_name", type=click.Choice(CLOUDS), default=None,
              help="Default: `burla config set cloud`, else the one cloud this machine is signed in to.")
@click.option("--region", default=None, help="Default: the cloud CLI's.")
@click.option("--machine-type", default=None, help="The machine type to check quota and image for (default: burla's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines.")
def check(cloud_name: str | None, region: str | None, machine_type: str | None, as_json: bool) -> None:
    """Check credentials, permissions, quota, image and the SSH path before anything boots."""
    driver, cloud_label = _configured_driver(cloud_name, region, "cloud check")
    checks = asyncio.run(_checks(driver, machine_type))
    failed = any(c.status == CloudCheck.FAIL for c in checks)
    if as_json:
        click.echo(json.dumps({"ok": not failed, "command": "cloud check",
                               "data": {"cloud": cloud_label, "checks": [dataclasses.asdict(c) for c in checks]}}))
    else:
        click.echo(f"burla cloud check: {cloud_label}")
        for c in checks:
            click.echo(f"{c.status:<4}  {c.name:<13} {c.detail}")
            if c.fix:
                click.echo(f"{'':<19} fix: {c.fix}")
    raise SystemExit(EXIT_CLOUD if failed else 0)


@cloud.command()
@click.option("--cloud", "cloud_name", type=click.Choice(CLOUDS), default=None,
              help="Default: `burla config set cloud`, else the one cloud this machine is signed in to.")
@click.option("--region", default=None, help="Default: the cloud CLI's.")
@click.option("--gpu", "gpus_only", is_flag=True, help="Only machine types with GPUs.")
@click.option("--refresh", is_flag=True, help="Ask the cloud again even if the saved list is less than a week old.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def machines(cloud_name: str | None, region: str | None, gpus_only: bool, refresh: bool, as_json: bool) -> None:
    """The machine types grow picks from: the region's, as the cloud lists them (kept a week)."""
    driver, cloud_label = _configured_driver(cloud_name, region, "cloud machines")
    catalog = asyncio.run(_catalog(driver, cloud_label, refresh))
    shown = [m for m in catalog.machines if m.gpu or not gpus_only]
    if as_json:
        click.echo(json.dumps({"ok": True, "command": "cloud machines", "data": {
            "cloud": cloud_label, "region": catalog.region, "source": catalog.source, "read_at": catalog.read_at,
            "problem": catalog.problem or None, "machines": [dataclasses.asdict(m) for m in shown]}}))
        return
    click.echo(f"burla cloud machines: {catalog.describe()}")
    click.echo(f"{'machine type':<28} {'vCPUs':>6} {'memory GB':>10} {'GPUs':<14} {'arch':<7} {'USD/h':>9}")
    for m in shown:
        gpus = f"{m.gpu_count} x {m.gpu}" if m.gpu else ""
        price = f"{m.usd_per_hour:.4f}" if m.usd_per_hour is not None else "?"
        click.echo(f"{m.name:<28} {m.vcpus:>6} {m.memory_gb:>10.1f} {gpus:<14} {m.arch:<7} {price:>9}")


def _configured_driver(cloud_name: str | None, region: str | None, command: str) -> tuple[Driver, str]:
    """The driver for the cloud asked for (or configured, or signed in to), and the cloud's name."""
    environ = dict(os.environ)
    try:
        driver_name = resolve_driver(for_cloud(cloud_name).name if cloud_name else None,
                                     read_client_config(config_dir()).get("cloud"), environ)
        if driver_name == LOCAL:
            raise CloudSetupError("no cloud configured and none signed in; run `burla config set cloud "
                                  "aws|gcp|azure` after signing in with the cloud's CLI")
        config = cloud_config(driver_name, environ, region, "check")
    except CloudSetupError as e:
        fail(command, CliError("cloud_setup", str(e), "see the README's \"Run on your cloud\"", EXIT_USAGE))
    return cloud_driver(config), next(c for c in CLOUDS if for_cloud(c).name == driver_name)


async def _catalog(driver: Driver, cloud_label: str, refresh: bool) -> RegionCatalog:
    try:
        return await region_catalog(driver, cloud_label, config_dir(), refresh=refresh)
    finally:
        await driver.close()


async def _checks(driver, machine_type: str | None) -> list[CloudCheck]:
    try:
        return await driver.check(machine_type)
    finally:
        await driver.close()


@cloud.group()
def images() -> None:
    """Baked images of the node runtime in your account (later VMs boot from them)."""


@images.command("list")
@click.option("--cloud", "cloud_name", type=click.Choice(CLOUDS), default=None,
              help="Default: `burla config set cloud`, else the one cloud this machine is signed in to.")
@click.option("--region", default=None, help="Default: the cloud CLI's.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines.")
def list_images(cloud_name: str | None, region: str | None, as_json: bool) -> None:
    """The baked images: id, key (build, Python, image family, architecture), state, when made."""
    driver, cloud_label = _configured_driver(cloud_name, region, "cloud images list")
    baked = asyncio.run(_closing(driver, driver.baked_images()))
    if as_json:
        click.echo(json.dumps({"ok": True, "command": "cloud images list", "data": {
            "cloud": cloud_label, "region": driver.region, "images": [dataclasses.asdict(b) for b in baked]}}))
        return
    click.echo(f"burla cloud images: {cloud_label} {driver.region} ({len(baked)} baked)")
    for image in baked:
        click.echo(f"{image.image_id:<24} {image.state:<10} {image.created:<26} {image.key}"
                   + (f"  {image.region}" if image.region else ""))


@images.command("delete")
@click.argument("image_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every baked image serving the region (GCE's are global).")
@click.option("--cloud", "cloud_name", type=click.Choice(CLOUDS), default=None,
              help="Default: `burla config set cloud`, else the one cloud this machine is signed in to.")
@click.option("--region", default=None, help="Default: the cloud CLI's.")
def delete_images(image_ids: tuple[str, ...], every: bool, cloud_name: str | None, region: str | None) -> None:
    """Delete baked images (and their snapshots); the next VMs install the runtime again."""
    if not image_ids and not every:
        fail("cloud images delete", CliError("bad_usage", "name the image ids to delete, or pass --all",
                                             "burla cloud images list", EXIT_USAGE))
    driver, _ = _configured_driver(cloud_name, region, "cloud images delete")

    async def delete() -> dict[str, bool]:
        named = list(image_ids) or [b.image_id for b in await driver.baked_images() if b.region in ("", driver.region)]
        return {image_id: await driver.delete_baked_image(image_id) for image_id in named}

    deleted = asyncio.run(_closing(driver, delete()))
    unknown = [image_id for image_id, done in deleted.items() if not done]
    if unknown:
        fail("cloud images delete", CliError("not_found", f"no baked image {', '.join(unknown)} (deleted: "
                                             f"{', '.join(i for i, done in deleted.items() if done) or 'none'})",
                                             "burla cloud images list", EXIT_NOT_FOUND))
    click.echo(json.dumps({"ok": True, "command": "cloud images delete", "data": {"deleted": sorted(deleted)}}))


async def _closing(driver: Driver, work: Awaitable[T]) -> T:
    try:
        return await work
    finally:
        await driver.close()
