"""`burla worker`: hidden; a node starts its workers through it."""

from __future__ import annotations

import click


@click.command(hidden=True)
@click.argument("sock_fd", type=int)
@click.argument("shm_fd", type=int)
def worker(sock_fd: int, shm_fd: int) -> None:
    """Serve calls for the node that started this process (internal)."""
    from burla.node.workers.worker import main

    main([str(sock_fd), str(shm_fd)])
