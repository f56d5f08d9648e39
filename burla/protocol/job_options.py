"""A job's options: what `remote_parallel_map` was asked for beyond the function and its inputs.

Declared once, here, under the names users give them. The client checks them (`JobOptions.checked`)
and sends them in its `OpenJob`, whose option fields are these, by name; the head reads them back
from the opening (`OpenJob.options`), and a node gets the ones that shape its calls in `AssignJob`
(`func_cpu`, `func_ram`, `func_gpu`, `timeout`), under the same names. "dynamic" travels as None.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from burla.config import MAX_RAM_GB_PER_CALL, MIN_RAM_GB_PER_CALL
from burla.errors import InvalidArgument
from burla.protocol.validation import GPU_CHOICES, IMAGE, REGION, matches

DYNAMIC = "dynamic"  # the user's word for "let the node decide": None on the wire
MAX_RETRIES = 100
MIN_TIMEOUT_S = 0.01
MAX_TIMEOUT_S = 7 * 86400.0


@dataclass(frozen=True)
class JobOptions:
    func_cpu: int | None = None  # CPUs per call; None: dynamic
    func_ram: float | None = None  # GB per call, enforced; None: dynamic
    func_gpu: str | None = None  # only nodes with this GPU run the job's calls
    image: str | None = None  # only nodes running this image
    grow: bool = False  # the cluster may boot nodes for the job
    max_parallelism: int | None = None  # the most calls at once across the cluster
    detach: bool = False  # the job runs on without its client once its inputs are up
    raise_errors: bool = True  # a call's exception ends the job (else it stands in the call's place)
    region: str | None = None  # where grown nodes boot
    disk_gb: int | None = None  # the boot disk of grown nodes
    parent_job_id: str | None = None  # the job whose call opened this one (nested jobs)
    retries: int = 0  # a call that raises runs again up to this many times; the last try's exception is seen
    timeout: float | None = None  # seconds a call may run; past it, it is stopped and fails with CallTimeout

    @classmethod
    def checked(cls, *, func_cpu: Any = DYNAMIC, func_ram: Any = DYNAMIC, func_gpu: Any = None, image: Any = None,
                grow: Any = False, max_parallelism: Any = None, detach: Any = False, raise_errors: Any = True,
                region: Any = None, disk_gb: Any = None, parent_job_id: str | None = None, retries: Any = 0,
                timeout: Any = None) -> JobOptions:
        """The options as a user passed them, checked; raises InvalidArgument saying what to fix."""
        ram = _resources("func_ram", func_ram, integer=False)
        if ram is not None and not MIN_RAM_GB_PER_CALL <= ram <= MAX_RAM_GB_PER_CALL:
            raise InvalidArgument(f"func_ram must be \"dynamic\" or a number of GB from {MIN_RAM_GB_PER_CALL:g} to "
                                  f"{MAX_RAM_GB_PER_CALL:g}, got {func_ram!r}")
        if func_gpu is not None and (not isinstance(func_gpu, str) or func_gpu.upper() not in GPU_CHOICES):
            raise InvalidArgument(f"func_gpu must be one of {', '.join(GPU_CHOICES)} or None, got {func_gpu!r}")
        if image is not None and not matches(IMAGE, image):
            raise InvalidArgument(f"image must be a container image reference such as python:3.12-slim or "
                                  f"ghcr.io/org/app:1.2 (letters, digits and ._/:@+-, not starting with -), "
                                  f"got {image!r}")
        if region is not None and not matches(REGION, region):
            raise InvalidArgument(f"region must be a cloud region name such as us-east-1, us-central1 or eastus, "
                                  f"got {region!r}")
        for name, value in (("disk_gb", disk_gb), ("max_parallelism", max_parallelism)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidArgument(f"{name} must be a positive integer or None, got {value!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise InvalidArgument(f"retries must be an integer from 0 to {MAX_RETRIES}, got {retries!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S):  # NaN fails too
            raise InvalidArgument(f"timeout must be None or a number of seconds from {MIN_TIMEOUT_S:g} to "
                                  f"{MAX_TIMEOUT_S:g} (a week), got {timeout!r}")
        return cls(func_cpu=_resources("func_cpu", func_cpu, integer=True), func_ram=ram, func_gpu=func_gpu,
                   image=image, grow=bool(grow), max_parallelism=max_parallelism, detach=bool(detach),
                   raise_errors=bool(raise_errors), region=region, disk_gb=disk_gb, parent_job_id=parent_job_id,
                   retries=retries, timeout=None if timeout is None else float(timeout))

    def fields(self) -> dict[str, Any]:
        """Every option by name, as an `OpenJob` takes them."""
        return {name: getattr(self, name) for name in OPTION_FIELDS}


OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(JobOptions))


def _resources(name: str, value: Any, integer: bool) -> Any:
    if value == DYNAMIC or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "a positive integer" if integer else "a positive number"
        raise InvalidArgument(f"{name} must be \"dynamic\" or {kind}, got {value!r}")
    if not value > 0 or value == math.inf:  # NaN too
        raise InvalidArgument(f"{name} must be a positive, finite number, got {value!r}")
    return int(value) if integer else float(value)
