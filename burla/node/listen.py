"""Where a node listens: the address it is given when the machine has it (a cloud VM's private
address, so that its port is not served on its public one), else every address."""

from __future__ import annotations

import ipaddress
import logging

import psutil

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")  # a node bound here is reached from this machine only

log = logging.getLogger("burla.node")


def bind_address(host: str) -> str:
    """Where the node listens: `host` if this machine has that address (a cloud VM's private
    address is on its interface, so its port is not served on its public one), else every address
    (a machine behind a NAT that maps the address it was given), said in the log."""
    if host in LOOPBACK_HOSTS or host in ("0.0.0.0", "::", ""):
        return host
    try:
        wanted = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:  # a name: bound as given, as before
        return host
    own = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            try:
                own.add(ipaddress.ip_address(address.address.split("%", 1)[0]))
            except ValueError:  # a link-layer address
                continue
    if wanted in own:
        return host
    log.warning("%s is not an address of this machine; listening on all of its addresses", host)
    return "::" if wanted.version == 6 else "0.0.0.0"
