"""What the cluster tells history as things happen, and the stand-in for a head that keeps none.

The cluster records through a `Recorder` whatever its history is: `History` writes it down,
`NoRecord` (a head run with --no-history) lets it go. So the cluster's code says what happened
once, without asking each time whether anyone keeps it (`keeps` lets a periodic loop skip building
what it would record for nobody).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from burla.protocol.views import JobView


class Recorder(Protocol):
    keeps: bool  # whether anything is kept (else a caller may skip building what it would record)

    def job(self, view: JobView, arguments: dict) -> None: ...

    def job_opened(self, job_id: str, opening: bytes) -> None: ...

    def job_closed(self, job_id: str) -> None: ...

    def job_sample(self, job_id: str, n_done: int, n_failed: int, running: int) -> None: ...

    def failures(self, job_id: str, results: list) -> None: ...

    def calls(self, job_id: str, node_id: str, indices: bytes, failed: bytes, timings: bytes,
              tries: dict[int, int] | None) -> None: ...

    def keep_inputs(self, job_id: str, items: list) -> None: ...

    def keep_results(self, job_id: str, items: list) -> None: ...

    def output(self, job_id: str, items: list) -> None: ...

    def node_event(self, node_id: str, event: str, detail: str = "") -> None: ...

    def node_sample(self, node_id: str, cpu_percent: float, mem_percent: float, net_sent_bps: float,
                    net_recv_bps: float, workers_alive: int, running: int, gpu_percent: float = 0.0,
                    gpu_mem_percent: float = 0.0) -> None: ...

    def after_flush(self, callback: Callable[[], None]) -> None:
        """Call `callback` once everything recorded so far is safe."""


class NoRecord:
    """No history: nothing is kept, and what is recorded is as safe as it gets at once."""

    keeps = False

    def job(self, view: JobView, arguments: dict) -> None:
        pass

    def job_opened(self, job_id: str, opening: bytes) -> None:
        pass

    def job_closed(self, job_id: str) -> None:
        pass

    def job_sample(self, job_id: str, n_done: int, n_failed: int, running: int) -> None:
        pass

    def failures(self, job_id: str, results: list) -> None:
        pass

    def calls(self, job_id: str, node_id: str, indices: bytes, failed: bytes, timings: bytes,
              tries: dict[int, int] | None) -> None:
        pass

    def keep_inputs(self, job_id: str, items: list) -> None:
        pass

    def keep_results(self, job_id: str, items: list) -> None:
        pass

    def output(self, job_id: str, items: list) -> None:
        pass

    def node_event(self, node_id: str, event: str, detail: str = "") -> None:
        pass

    def node_sample(self, node_id: str, cpu_percent: float, mem_percent: float, net_sent_bps: float,
                    net_recv_bps: float, workers_alive: int, running: int, gpu_percent: float = 0.0,
                    gpu_mem_percent: float = 0.0) -> None:
        pass

    def after_flush(self, callback: Callable[[], None]) -> None:
        callback()  # kept in memory only: nothing more to wait for
