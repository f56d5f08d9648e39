"""What the head holds at most, so that no credential's holder can exhaust it: jobs running at
once, and job connections per credential. Per input, a job costs nothing until its inputs come
(`JobRecord.cover`), and what it holds of them is bounded by its upload window
(`messages.CLIENT_WINDOW_BYTES`): the open-jobs limit bounds the inputs held head-wide. Past a
limit, the head refuses with a message that names it and how to raise it.

A job's calls hold its job token, which opens nested jobs: the jobs under one top-level job (its
tree) have a budget of their own, apart from the head-wide limits, on how many are open at once
and on the bytes they hold here (their functions, local code and inputs not yet on a node), so
that one job's calls can't fill the head for everyone (BudgetExceeded, 429)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from burla.errors import BudgetExceeded, Overloaded
from burla.head.scheduling.records import RUNNING, JobRecord
from burla.protocol import wire

DEFAULT_MAX_OPEN_JOBS = 4096  # nested jobs of every worker of a large cluster, with room
DEFAULT_MAX_CLIENT_CONNECTIONS = 4096
DEFAULT_MAX_TREE_JOBS = 256  # open jobs nested under one top-level job
DEFAULT_MAX_TREE_MB = 512  # what those hold on the head: functions, local code, inputs not yet on a node


@dataclass(frozen=True)
class HeadLimits:
    max_open_jobs: int = DEFAULT_MAX_OPEN_JOBS
    max_client_connections: int = DEFAULT_MAX_CLIENT_CONNECTIONS  # job connections per credential
    max_tree_jobs: int = DEFAULT_MAX_TREE_JOBS
    max_tree_mb: int = DEFAULT_MAX_TREE_MB


def _root(jobs: Mapping[str, JobRecord], job_id: str) -> str:
    seen = {job_id}
    while (job := jobs.get(job_id)) is not None and job.spec.parent_job_id and job.spec.parent_job_id not in seen:
        job_id = job.spec.parent_job_id
        seen.add(job_id)
    return job_id


def held_bytes(job: JobRecord) -> int:
    """What a job holds on the head: its function, its local code and its queued inputs."""
    return len(job.spec.function_bytes) + len(job.spec.local_code) + job.pending.bytes_held()


def check_tree_budget(limits: HeadLimits, jobs: Mapping[str, JobRecord], caller_job: str,
                      opening: wire.OpenJob) -> None:
    """Refuse a nested job (opened with `caller_job`'s token) past its tree's own budget."""
    root = _root(jobs, caller_job)
    tree = [job for job in jobs.values()
            if job.status == RUNNING and job.job_id != root and _root(jobs, job.job_id) == root]
    if len(tree) >= limits.max_tree_jobs:
        raise BudgetExceeded(
            f"job {root}'s calls have {len(tree)} nested jobs open, its tree's limit (burla head serve "
            f"--max-tree-jobs {limits.max_tree_jobs}); open this one when one of them has ended, or raise the limit")
    held = sum(map(held_bytes, tree)) + len(opening.function_bytes) + len(opening.local_code)
    if held > limits.max_tree_mb * 2**20:
        raise BudgetExceeded(
            f"job {root}'s nested jobs would hold {held / 2**20:.0f} MB on the head (functions, local code and "
            f"inputs not yet on a node), over its tree's limit (burla head serve --max-tree-mb "
            f"{limits.max_tree_mb}); pass large objects as inputs of fewer jobs, or raise the limit")


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
