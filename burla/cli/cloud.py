"""`burla cloud check`: before the first VM boots, what this machine's cloud account allows.

One line per check (credentials, machine type, image, network, permissions, vCPU quota, SSH
path) with the fix for any that fails; `--json` prints the CLI's usual JSON document instead.
Exit code 0 when nothing failed, 9 when a check failed (booting would fail), 2 for bad usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

import click

from burla.cli.common import EXIT_CLOUD, EXIT_USAGE, CliError, JsonGroup, fail
from burla.config import config_dir, read_client_config
from burla.drivers.base import CloudCheck
from burla.drivers.registry import CLOUDS, LOCAL, cloud_config, cloud_driver, for_cloud, resolve_driver
from burla.errors import CloudSetupError


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
    environ = dict(os.environ)
    try:
        driver_name = resolve_driver(for_cloud(cloud_name).name if cloud_name else None,
                                     read_client_config(config_dir()).get("cloud"), environ)
        if driver_name == LOCAL:
            raise CloudSetupError("no cloud configured and none signed in; run `burla config set cloud "
                                  "aws|gcp|azure` after signing in with the cloud's CLI")
        config = cloud_config(driver_name, environ, region, "check")
    except CloudSetupError as e:
        fail("cloud check", CliError("cloud_setup", str(e), "see the README's \"Run on your cloud\"", EXIT_USAGE))
        return
    checks = asyncio.run(_checks(cloud_driver(config), machine_type))
    failed = any(c.status == CloudCheck.FAIL for c in checks)
    cloud_label = next(c for c in CLOUDS if for_cloud(c).name == driver_name)
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


async def _checks(driver, machine_type: str | None) -> list[CloudCheck]:
    try:
        return await driver.check(machine_type)
    finally:
        await driver.close()
