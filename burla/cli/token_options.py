"""The cluster token on the command line: never as a value (`ps` shows every process's arguments
to every user of the machine), only from the environment (BURLA_CLUSTER_TOKEN) or a file only
its owner may read (`--token-file`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click

from burla.config import ENV_TOKEN

TOKEN_ON_COMMAND_LINE = (
    "a token given on the command line is visible to every user of this machine (`ps` lists every "
    "process's arguments); set BURLA_CLUSTER_TOKEN, or pass --token-file FILE (a file only you may read: "
    "chmod 600 FILE)"
)
TOKEN_HELP = "Cluster token, from BURLA_CLUSTER_TOKEN only (refused as a value on the command line: `ps` shows it)."
TOKEN_FILE_HELP = "A file holding the cluster token, readable by its owner alone (chmod 600)."


def refuse_command_line_token(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--token`'s callback: a value on the command line is refused; the token is the
    environment's (BURLA_CLUSTER_TOKEN), if it has one."""
    if value is not None:
        raise click.BadParameter(TOKEN_ON_COMMAND_LINE, ctx=ctx, param=param)
    return os.environ.get(ENV_TOKEN) or None


def refuse_token_value(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A `--token` after a subcommand: refused as a value; the environment was read before it."""
    if value is not None:
        raise click.BadParameter(TOKEN_ON_COMMAND_LINE, ctx=ctx, param=param)


def token_in_file(path: str, ctx: click.Context | None = None, param: click.Parameter | None = None) -> str:
    """The token a `--token-file` holds, if only its owner may read it."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        text = file.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"can't read {path}: {e}", ctx=ctx, param=param) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.BadParameter(f"{path} may be read by other users (mode {stat.filemode(mode)}); a token file must "
                                 f"be its owner's alone: chmod 600 {path}", ctx=ctx, param=param)
    if not text or any(c.isspace() for c in text):
        raise click.BadParameter(f"{path} holds no token (one line, no spaces)", ctx=ctx, param=param)
    return text


def read_token_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--token-file`'s callback: the token it holds."""
    return token_in_file(value, ctx, param) if value is not None else None
