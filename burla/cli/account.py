"""`burla config ...` and `burla auth status`: this machine's client configuration."""

from __future__ import annotations

import json
import urllib.parse

import click

from burla.cli.common import CliError, JsonGroup, head_client, run
from burla.config import CLIENT_CONFIG_FILE as CONFIG_FILE
from burla.config import ENV_TOKEN, config_dir, read_client_config, write_private_file
from burla.drivers.registry import CLOUDS


def _read_config() -> dict:
    return read_client_config(config_dir())


@click.group(cls=JsonGroup)
def config() -> None:
    """Show or set this machine's burla configuration (JSON output)."""


@config.command()
def get() -> None:
    """The configuration file's contents and where it is."""
    run("config get", lambda: {"path": str(config_dir() / CONFIG_FILE), "config": _read_config()})


@config.command("set")
@click.argument("key", type=click.Choice(["cloud", "background_head", "direct_inputs", "direct_results"]))
@click.argument("value")
def set_value(key: str, value: str) -> None:
    """Set a value: `burla config set cloud aws` (where heads this machine starts boot VMs),
    `burla config set background_head false` (a script starts a head that stops with it), or
    `burla config set direct_inputs false` (large inputs always go through the head), or
    `burla config set direct_results false` (large results always come through the head)."""

    def action() -> dict:
        stored: str | bool = value
        if key == "cloud" and value not in CLOUDS:
            raise CliError("bad_usage", f"cloud must be one of {', '.join(CLOUDS)}, got {value!r}",
                           "e.g. `burla config set cloud aws`", 2)
        if key != "cloud":
            if value.lower() not in ("true", "false"):
                raise CliError("bad_usage", f"{key} must be true or false, got {value!r}",
                               f"e.g. `burla config set {key} false`", 2)
            stored = value.lower() == "true"
        data = _read_config()
        data[key] = stored
        write_private_file(config_dir() / CONFIG_FILE, json.dumps(data, indent=2))
        return {"path": str(config_dir() / CONFIG_FILE), "config": data}

    run("config set", action)


@click.group(cls=JsonGroup)
def auth() -> None:
    """Which head this machine talks to, and with which token."""


@auth.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """The head URL, where it and the token come from, and whether the head accepts the token."""

    def action() -> dict:
        client = head_client(ctx)
        if ctx.obj.get("token"):
            token_source = "--token" if ctx.obj.get("token_from_flag") else ENV_TOKEN
        elif client.token:
            token_source = str(config_dir() / "cluster_token")
        else:
            token_source = None
        try:
            version = client.get("/v1/cluster")["version"]
            authorized, reachable = True, True
        except CliError as e:
            if e.exit_code == 6:
                version, authorized, reachable = None, False, False
            else:
                version, authorized, reachable = None, False, True
        return {"head_url": client.url, "head_source": client.source, "token_source": token_source,
                "reachable": reachable, "authorized": authorized, "head_version": version}

    run("auth status", action)


@click.command()
@click.option("--next", "target", default="/", show_default=True, help="Page to open, e.g. /jobs/JOB_ID.")
@click.option("--open", "open_browser", is_flag=True, help="Also open the link in a web browser.")
@click.pass_context
def dashboard(ctx: click.Context, target: str, open_browser: bool) -> None:
    """Print a one-time link (valid five minutes) that signs a browser in to the dashboard."""

    def action() -> dict:
        client = head_client(ctx)
        link = client.post(f"/v1/login-link?{urllib.parse.urlencode({'next': target})}")
        if open_browser:
            import webbrowser

            webbrowser.open(link["url"])
        return {"head_url": client.url, **link}

    run("dashboard", action)
