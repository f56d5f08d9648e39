"""What the head holds at most, so that no credential's holder can exhaust it: jobs running at
once, and job connections per credential. Per input, a job costs nothing until its inputs come
(`JobRecord.cover`), and what it holds of them is bounded by its upload window
(`messages.CLIENT_WINDOW_BYTES`): the open-jobs limit bounds the inputs held head-wide. Past a
limit, the head refuses with a message that names it and how to raise it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from burla.errors import Overloaded

DEFAULT_MAX_OPEN_JOBS = 4096  # nested jobs of every worker of a large cluster, with room
DEFAULT_MAX_CLIENT_CONNECTIONS = 4096


@dataclass(frozen=True)
class HeadLimits:
    max_open_jobs: int = DEFAULT_MAX_OPEN_JOBS
    max_client_connections: int = DEFAULT_MAX_CLIENT_CONNECTIONS  # job connections per credential


def check_open_job(limits: HeadLimits, running: int) -> None:
    """Refuse a new job when `running` jobs already run and that is the limit."""
    if running >= limits.max_open_jobs:
        raise Overloaded(f"the head runs {running} jobs, its limit (burla head serve --max-open-jobs "
                         f"{limits.max_open_jobs}); open this one when another has ended, or raise the limit")


class ConnectionCounts:
    """Open job connections per credential (a held slot is given back when the connection ends)."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()

    def take(self, credential: str, limits: HeadLimits) -> str | None:
        """Take a slot for `credential`; the refusal (naming the limit) if it has none left."""
        if self._open[credential] >= limits.max_client_connections:
            return (f"{self._open[credential]} job connections are open with this credential, its limit (burla head "
                    f"serve --max-client-connections {limits.max_client_connections}); close one, or raise the limit")
        self._open[credential] += 1
        return None

    def give_back(self, credential: str) -> None:
        self._open[credential] -= 1
        if self._open[credential] <= 0:
            del self._open[credential]
