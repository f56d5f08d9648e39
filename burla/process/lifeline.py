"""Lifelines: a pipe whose far end a parent holds open, so a child notices when it dies."""

from __future__ import annotations

import asyncio
import os


async def wait_for_eof(fd: int) -> None:
    """Return once every writer of the pipe `fd` has closed it (the parent exited)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb"))
    try:
        while await reader.read(4096):
            pass
    finally:
        transport.close()
