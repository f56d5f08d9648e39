"""`burla jobs ...`: find, watch, debug and cancel jobs (JSON output)."""

from __future__ import annotations

import json
import sys
import time

import click

from burla.cli.common import (
    EXIT_JOB_CANCELED,
    EXIT_JOB_FAILED,
    CliError,
    JsonGroup,
    emit_line,
    fail,
    head_client,
    run,
)
from burla.protocol.states import JobStatus
from burla.protocol.views import JobView

END_EXIT = {JobStatus.COMPLETED: 0, JobStatus.FAILED: EXIT_JOB_FAILED, JobStatus.CANCELED: EXIT_JOB_CANCELED}


@click.group(cls=JsonGroup)
def jobs() -> None:
    """Find, watch, debug and cancel jobs (JSON output)."""


@jobs.command("list")
@click.option("--status", type=click.Choice(["running", "completed", "failed", "canceled"], case_sensitive=False))
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.pass_context
def list_jobs(ctx: click.Context, status: str | None, limit: int) -> None:
    """Jobs, most recent first."""
    run("jobs list", lambda: head_client(ctx).get("/v1/jobs", status=status.upper() if status else None,
                                                   limit=limit)["jobs"])


@jobs.command()
@click.argument("job_id")
@click.pass_context
def show(ctx: click.Context, job_id: str) -> None:
    """One job: status, counts, timing, arguments, parent."""
    run("jobs show", lambda: head_client(ctx).get(f"/v1/jobs/{job_id}"))


@jobs.command()
@click.argument("job_id")
@click.option("--interval", type=click.FloatRange(0.1, 60.0), default=1.0, show_default=True)
@click.pass_context
def watch(ctx: click.Context, job_id: str, interval: float) -> None:
    """Stream a job's progress as NDJSON until it ends; the exit code says how it ended."""
    try:
        client = head_client(ctx)
        previous = None
        while True:
            job = client.get(f"/v1/jobs/{job_id}")
            if job != previous:
                emit_line("jobs watch", "snapshot" if previous is None else "change", job)
                previous = job
            status = JobView.from_json(job).status
            if status != JobStatus.RUNNING:
                sys.exit(END_EXIT[status])
            time.sleep(interval)
    except CliError as e:
        fail("jobs watch", e)
    except KeyboardInterrupt:
        sys.exit(130)


@jobs.command()
@click.argument("job_id")
@click.option("--reason", default="canceled with the CLI", show_default=True)
@click.pass_context
def cancel(ctx: click.Context, job_id: str, reason: str) -> None:
    """Cancel a running job: its calls stop on every node."""
    run("jobs cancel", lambda: head_client(ctx).post(f"/v1/jobs/{job_id}/cancel", {"reason": reason}))


def _frames(traceback_text: str) -> str:
    """A traceback without its final message: calls that failed the same way share it."""
    return "\n".join(line for line in traceback_text.splitlines() if line.startswith("  File "))


@jobs.command()
@click.argument("job_id")
@click.pass_context
def errors(ctx: click.Context, job_id: str) -> None:
    """Failed calls, grouped by where they failed (same exception type and frames)."""

    def action() -> dict:
        failures = head_client(ctx).get(f"/v1/jobs/{job_id}/failures", limit=100_000)["failures"]
        groups: dict[tuple[str, str], dict] = {}
        for failure in failures:
            key = (failure["exception_type"], _frames(failure["traceback"]))
            group = groups.setdefault(key, {
                "exception_type": failure["exception_type"], "count": 0, "input_indices": [],
                "example_message": failure["message"], "traceback": failure["traceback"],
                "example_where": {name: failure[name] for name in ("node_id", "host", "worker_pid")},
                "nodes": {},
            })
            group["count"] += 1
            if len(group["input_indices"]) < 50:
                group["input_indices"].append(failure["input_index"])
            node = failure["node_id"] or "unknown"
            group["nodes"][node] = group["nodes"].get(node, 0) + 1  # a node that fails more than its share
        ordered = sorted(groups.values(), key=lambda g: -g["count"])
        return {"job_id": job_id, "failed_calls": len(failures), "groups": ordered}

    run("jobs errors", action)


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


@jobs.command()
@click.argument("job_id")
@click.pass_context
def results(ctx: click.Context, job_id: str) -> None:
    """Collect a detached job's results (once; the head forgets them after)."""

    def action() -> dict:
        from burla.client.api import Client
        from burla.errors import BurlaError, JobNotFound

        head = head_client(ctx)
        try:
            values = Client(head.url, head.token).get_results(job_id, raise_errors=False, spinner=False)
        except JobNotFound as e:
            raise CliError("not_found", str(e), "`burla jobs list` shows jobs; results are kept only for detached jobs",
                           4) from None
        except BurlaError as e:
            raise CliError("job_error", str(e), "see `burla jobs errors`", EXIT_JOB_FAILED) from None
        rows = []
        for index, value in enumerate(values):
            if isinstance(value, BaseException):
                rows.append({"input_index": index, "ok": False, "error": f"{type(value).__name__}: {value}"})
            else:
                rows.append({"input_index": index, "ok": True, "value": _jsonable(value)})
        return {"job_id": job_id, "results": rows}

    run("jobs results", action)


@jobs.command()
@click.argument("job_id")
@click.pass_context
def metrics(ctx: click.Context, job_id: str) -> None:
    """Progress over time and per-node CPU and memory while the job ran."""
    run("jobs metrics", lambda: head_client(ctx).get(f"/v1/jobs/{job_id}/metrics"))


@jobs.group(cls=JsonGroup)
def calls() -> None:
    """Each call of a job: its state and what it printed."""


@calls.command("list")
@click.argument("job_id")
@click.option("--failed-only", is_flag=True)
@click.option("--offset", type=click.IntRange(0, None), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.pass_context
def list_calls(ctx: click.Context, job_id: str, failed_only: bool, offset: int, limit: int) -> None:
    """Calls with their state (done, failed, pending)."""
    run("jobs calls list", lambda: head_client(ctx).get(
        f"/v1/jobs/{job_id}/calls", failed_only=str(failed_only).lower(), offset=offset, limit=limit))


@calls.command()
@click.argument("job_id")
@click.argument("input_index", type=click.IntRange(0, None))
@click.pass_context
def logs(ctx: click.Context, job_id: str, input_index: int) -> None:
    """Everything one call printed (stdout and stderr, in order)."""

    def action() -> dict:
        rows = head_client(ctx).get(f"/v1/jobs/{job_id}/calls/{input_index}/output")["output"]
        return {"job_id": job_id, "input_index": input_index, "text": "".join(r["text"] for r in rows),
                "chunks": rows}

    run("jobs calls logs", action)
