"""What every management command shares: one JSON document out, exit codes that say what
happened, and a small authenticated HTTP client for the head.

    {"ok": true, "command": "jobs list", "data": ...}
    {"ok": false, "command": "jobs show", "error": {"code", "message", "remediation"}}

Exit codes: 0 ok, 2 bad usage, 3 auth, 4 not found, 5 conflict, 6 head unreachable,
7 job failed, 8 job cancelled. Streams (watch, logs --follow) print one JSON object per line.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click

from burla.cli.background_head import live_head
from burla.config import ENV_HEAD_URL, ENV_TOKEN, Deployment, config_dir, head_cert_file, read_token

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5
EXIT_UNREACHABLE = 6
EXIT_JOB_FAILED = 7
EXIT_JOB_CANCELED = 8
EXIT_CLOUD = 9  # a cloud API refused or failed


class CliError(Exception):
    def __init__(self, code: str, message: str, remediation: str, exit_code: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.remediation = remediation
        self.exit_code = exit_code


def _print(document: dict[str, Any]) -> None:
    click.echo(json.dumps(document, default=str))


def emit(command: str, data: Any) -> None:
    _print({"ok": True, "command": command, "data": data})


def emit_line(command: str, event: str, data: Any) -> None:
    """One line of a stream (NDJSON)."""
    click.echo(json.dumps({"command": command, "event": event, "data": data}, default=str))
    sys.stdout.flush()


def fail(command: str, error: CliError) -> NoReturn:
    _print({"ok": False, "command": command,
            "error": {"code": error.code, "message": error.message, "remediation": error.remediation}})
    sys.exit(error.exit_code)


def run(command: str, action: Callable[[], Any]) -> None:
    """Run a command's action and print its one JSON document (or its error)."""
    try:
        data = action()
    except CliError as e:
        fail(command, e)
    else:
        emit(command, data)


class JsonGroup(click.Group):
    """A command group whose usage errors are JSON documents too (exit code 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            path = (e.ctx or ctx).command_path
            command = " ".join(path.split()[1:]) or path
            fail(command, CliError("bad_usage", e.format_message(), f"see `{path} --help`", EXIT_USAGE))


@dataclass
class HeadClient:
    url: str
    token: str | None
    source: str  # where the URL came from
    cert: str | None = field(default_factory=lambda: head_cert_file(config_dir()))

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> Any:
        if not self.token:
            raise CliError("no_token", f"no cluster token for {self.url}",
                           f"set {ENV_TOKEN}, or put the head's token in {config_dir() / 'cluster_token'}", EXIT_AUTH)
        import urllib.error  # here, not at the top: `burla head serve` and `burla node join` don't need them
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        from burla.web.tls import CERT_FIX, client_context, is_certificate_error

        try:
            with urllib.request.urlopen(request, timeout=timeout, context=client_context(self.cert)) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            raise _http_error(e, self.url) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if is_certificate_error(e):
                raise CliError("head_untrusted", f"the head at {self.url} presented a certificate this machine "
                               f"does not trust: {reason}", CERT_FIX, EXIT_UNREACHABLE) from None
            fix = ("it runs but does not answer: stop it with `burla head stop --force`, then `burla cluster start`"
                   if self.source.startswith("running local head") else
                   "start one with `burla cluster start`, or pass --head URL")
            raise CliError("head_unreachable", f"can't reach the head at {self.url}: {reason}", fix,
                           EXIT_UNREACHABLE) from None

    def get(self, path: str, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        return self.request("GET", path + (f"?{urllib.parse.urlencode(params)}" if params else ""))

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.request("POST", path, body if body is not None else {})


def _http_error(error: Any, url: str) -> CliError:
    """A CliError for an urllib.error.HTTPError from the head."""
    try:
        message = json.loads(error.read()).get("message", error.reason)
    except (ValueError, AttributeError):
        message = str(error.reason)
    if error.code == 401:
        return CliError("unauthorized", message, f"use the token of the head at {url} ({ENV_TOKEN})", EXIT_AUTH)
    if error.code == 404:
        return CliError("not_found", message, "list what exists with `burla jobs list` or `burla nodes list`",
                        EXIT_NOT_FOUND)
    if error.code == 409:
        return CliError("conflict", message, "check its current state with `burla jobs show`", EXIT_CONFLICT)
    if error.code == 502:  # the head is fine; the cloud behind it refused
        return CliError("cloud_refused", message, "fix what the cloud's message names (a machine type, a quota, "
                        "a zone or region: `burla settings update`), then run the command again", EXIT_CLOUD)
    if 400 <= error.code < 500:
        return CliError("bad_request", message, "fix the value the message names", EXIT_USAGE)
    return CliError("head_error", f"the head answered HTTP {error.code}: {message}", "see the head's log",
                    EXIT_UNREACHABLE)


def find_head_client(ctx: click.Context) -> HeadClient | None:
    """The head selected by --head, BURLA_CLUSTER_DASHBOARD_URL, or this machine's running head;
    None if there is none."""
    directory = config_dir()
    token = ctx.obj.get("token") if ctx.obj else None
    token = token or read_token(directory)
    url = ctx.obj.get("head") if ctx.obj else None
    if url:
        source = "--head" if ctx.obj.get("head_from_flag") else ENV_HEAD_URL
        return HeadClient(url.rstrip("/"), token, source)
    deployment = Deployment.read(directory)
    if deployment is not None:
        return HeadClient(deployment.head_url, (ctx.obj.get("token") if ctx.obj else None) or deployment.token,
                          f"the {deployment.cloud} head `burla deploy` started")
    record, note = live_head(directory)
    if record is not None:
        return HeadClient(record.url, token, f"running local head (pid {record.pid})")
    if note and ctx.obj is not None:
        ctx.obj["stale_head"] = note  # said by the command that finds no head
    return None


def head_client(ctx: click.Context) -> HeadClient:
    """The selected head (see find_head_client); a CliError saying how to get one if there is none."""
    client = find_head_client(ctx)
    if client is None:
        stale = ctx.obj.get("stale_head") if ctx.obj else None
        message = "no head is configured and none runs on this machine" + (f" ({stale})" if stale else "")
        raise CliError("no_head", message,
                       f"start one with `burla cluster start`, or pass --head URL (or set {ENV_HEAD_URL})",
                       EXIT_UNREACHABLE)
    return client


def vm_setup_options(command):
    """--node-index-url, --node-wheelhouse and the hidden --ssh-address-map: how VMs are set up,
    shared by `burla head serve` and `burla deploy`."""
    from pathlib import Path

    from burla.config import ENV_NODE_INDEX_URL, ENV_NODE_WHEELHOUSE, ENV_SSH_ADDRESS_MAP

    options = [
        click.option("--node-index-url", envvar=ENV_NODE_INDEX_URL, default=None,
                     help="Package index (a mirror) VMs install burla's dependencies from. Default: pip's own "
                          "setting on the VM. burla itself never comes from an index: VMs get this build."),
        click.option("--node-wheelhouse", envvar=ENV_NODE_WHEELHOUSE, default=None,
                     type=click.Path(exists=True, file_okay=False, path_type=Path),
                     help="A directory of wheels for burla's dependencies, uploaded to every VM and installed "
                          "from with no index (VMs without internet access)."),
        click.option("--ssh-address-map", envvar=ENV_SSH_ADDRESS_MAP, default=None, hidden=True,
                     type=click.Path(dir_okay=False, path_type=Path)),
    ]
    for option in reversed(options):
        command = option(command)
    return command
