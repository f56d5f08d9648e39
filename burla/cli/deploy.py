"""`burla deploy ...`: run the head in your cloud (a VM serving https) and point this machine at it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from burla.cli.common import EXIT_CLOUD, EXIT_NOT_FOUND, EXIT_USAGE, CliError, JsonGroup, run, vm_setup_options
from burla.config import config_dir


@click.group(cls=JsonGroup)
def deploy() -> None:
    """Run a head in your AWS, Google Cloud or Azure account, so cloud nodes can reach it (JSON output)."""


def _deploy_command(cloud: str, what: str):
    @deploy.command(cloud, help=f"Boot a head VM in {what} serving https, and use it from this machine.")
    @click.option("--region", default=None, help="Region for the head and its nodes. Default: the cloud CLI's.")
    @click.option("--machine-type", default=None, help="The head VM's machine type.")
    @click.option("--disk-gb", type=click.IntRange(10, 65_536), default=None, help="The head VM's disk size.")
    @click.option("--port", type=click.IntRange(1, 65535), default=5001, show_default=True,
                  help="The https port the head serves on.")
    @click.option("--wait", "wait_s", type=click.FloatRange(0, 3600), default=600, show_default=True,
                  help="Seconds to wait for the head to serve once started (0: don't wait).")
    @vm_setup_options
    def command(region: str | None, machine_type: str | None, disk_gb: int | None, port: int, wait_s: float,
                node_index_url: str | None, node_wheelhouse: Path | None, ssh_address_map: Path | None) -> None:
        from burla.drivers.deploy import DeployRequest, DeploySettings
        from burla.drivers.ssh.bootstrap import PackageSource

        request = DeployRequest(cloud, region, machine_type, disk_gb, port, wait_s)
        packages = PackageSource(node_index_url, str(node_wheelhouse) if node_wheelhouse else None)
        settings = DeploySettings(packages, ssh_address_map)
        run(f"deploy {cloud}", lambda: _guarded(lambda: _deploy(request, settings)))

    return command


def _deploy(request, settings):
    from burla.drivers.deploy import deploy as deploy_head

    return deploy_head(request, config_dir(), dict(os.environ), settings)


def _guarded(action):
    from burla.errors import CloudSetupError, DeployError

    try:
        return action()
    except CloudSetupError as e:
        raise CliError("cloud_setup", str(e), "fix the cloud setup as the message says, then try again",
                       EXIT_USAGE) from None
    except DeployError as e:
        code = EXIT_NOT_FOUND if "no head is deployed" in str(e) else EXIT_USAGE
        raise CliError("deploy", str(e), "see `burla deploy --help`", code) from None
    except Exception as e:  # the cloud refused or failed: say what it said
        raise CliError("cloud_error", f"{type(e).__name__}: {e}", "check the cloud console; `burla deploy delete` "
                       "removes what was created", EXIT_CLOUD) from None


_deploy_command("aws", "your AWS account (EC2)")
_deploy_command("gcp", "your Google Cloud project (Compute Engine)")
_deploy_command("azure", "your Azure subscription")


@deploy.command()
def show() -> None:
    """The deployed head this machine uses, and whether it serves."""
    from burla.drivers.deploy import show as show_deployment

    run("deploy show", lambda: _guarded(lambda: show_deployment(config_dir())))


@deploy.command()
def delete() -> None:
    """Delete the deployed head VM and its nodes; this machine goes back to local heads."""
    from burla.drivers.deploy import delete as delete_deployment

    run("deploy delete", lambda: _guarded(lambda: delete_deployment(config_dir(), dict(os.environ))))
