"""A VM's SSH host keys as its cloud reports them, so that the head trusts a VM's first SSH
connection only if the server presents one of them, before anything secret travels.

An attacker on the path at a VM's first boot (a laptop on hostile Wi-Fi) could otherwise answer
as the VM and take the token. The key comes from the cloud's API, which only the account can
read: cloud-init prints the host keys it made to the serial console between `-----BEGIN SSH HOST
KEY KEYS-----` and `-----END SSH HOST KEY KEYS-----` (its `keys_to_console` module;
cloudinit.readthedocs.io/en/latest/reference/modules.html#keys-to-console), which EC2's
GetConsoleOutput (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetConsoleOutput.html) and
Azure's boot diagnostics serial log (learn.microsoft.com/azure/virtual-machines/boot-diagnostics)
return; Compute Engine's guest agent writes them as guest attributes in namespace `hostkeys/`
when the instance's metadata has `enable-guest-attributes: TRUE`
(cloud.google.com/compute/docs/instances/view-ssh-host-keys).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from burla.errors import BootstrapFailed

BEGIN, END = "-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"
_KEY = re.compile(r"\b(ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) ([A-Za-z0-9+/]+={0,2})")
REPORT_POLL_S = 3.0


def console_host_keys(console: str) -> list[str]:
    """The host keys (`type base64`) in the last block cloud-init printed to a console (lines may
    carry a prefix, e.g. `ec2: ` or a kernel timestamp); [] when it has printed none yet."""
    start = console.rfind(BEGIN)
    end = console.find(END, start)
    if start < 0 or end < 0:
        return []
    return [f"{kind} {body}" for kind, body in _KEY.findall(console[start + len(BEGIN):end])]


def key_body(key: str) -> str:
    """`type base64` of an OpenSSH public key line (its comment dropped)."""
    return " ".join(key.split()[:2])


def fingerprint(key: str) -> str:
    """The key's SHA256 fingerprint as `ssh-keygen -l` prints it."""
    parts = key.split()
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (IndexError, ValueError):
        return f"(not a key: {key[:40]!r})"
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"{parts[0]} SHA256:{digest}"


async def reported_keys(report: Callable[[], Awaitable[list[str]]], deadline: float, what: str,
                        note: Callable[[str], None]) -> list[str]:
    """Ask the cloud for the VM's host keys until it reports some (cloud-init prints them late in
    the first boot); BootstrapFailed at the deadline."""
    asked = 0
    while True:
        asked += 1
        try:
            keys = await report()
        except Exception as e:  # noqa: BLE001 - a cloud API hiccup; ask again
            keys = []
            note(f"host key lookup failed: {type(e).__name__}: {e}")
        if keys:
            return keys
        if asked == 1:
            note(f"waiting for the cloud to report {what}'s SSH host keys (cloud-init prints them at the end of a "
                 "first boot); nothing secret is sent before they match")
        if time.monotonic() > deadline:
            raise BootstrapFailed(f"the cloud never reported {what}'s SSH host keys before the boot deadline, so "
                                  "its first connection could not be verified; nothing secret was sent to it")
        await asyncio.sleep(REPORT_POLL_S)


def check_host_key(presented: str, reported: list[str], what: str, address: str) -> None:
    """Refuse a server whose key is not among those the cloud reports, naming both fingerprints."""
    if key_body(presented) in {key_body(key) for key in reported}:
        return
    raise BootstrapFailed(
        f"{what} at {address} presented SSH host key {fingerprint(presented)}, but its cloud reports "
        f"{', '.join(fingerprint(key) for key in reported)}: someone may be answering in its place; nothing "
        "secret was sent to it")


async def verified_connection(connect: Callable[[], Awaitable[Any]], report: Callable[[], Awaitable[list[str]]],
                              deadline: float, what: str, address: str, note: Callable[[str], None]) -> Any:
    """A first SSH connection to a VM, kept only if its server's host key is one the cloud reports."""
    from burla.drivers.ssh.login import host_key_of

    connection = await connect()
    try:
        check_host_key(host_key_of(connection), await reported_keys(report, deadline, what, note), what, address)
    except BaseException:
        connection.close()
        raise
    return connection
