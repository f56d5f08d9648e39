"""What a machine type is (vCPUs, memory, GPUs, architecture, price), GPU model names, and the
small offline table grow falls back on when a cloud's own list of machine types can't be read.

The machines grow picks from come from each cloud's API (`burla.drivers.machine_catalog`); the
OFFLINE tables below are only a fallback (and a price estimate where the cloud's list carries
none): hand-written, approximate, and marked as such wherever they are used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float
    gpu: str | None = None
    gpu_count: int = 0
    usd_per_hour: float | None = None  # on-demand list price in the catalog's region; None: unknown
    arch: str = "x86_64"  # or arm64

    @property
    def family(self) -> str:
        """The sizes of one kind: m7i.2xlarge -> m7i, n4-standard-4 -> n4-standard, and Azure's
        Standard_D8as_v5 -> Standard_Das_v5 (its size is the number inside the name)."""
        if "." in self.name:
            return self.name.split(".")[0]
        if self.name.startswith("Standard_"):
            return re.sub(r"^(Standard_[A-Z]+)\d+", r"\1", self.name)
        return self.name.rsplit("-", 1)[0]


def _family(prefix: str, sizes: dict[str, int], gb_per_vcpu: float, usd_per_vcpu_hour: float,
            sep: str = ".") -> list[MachineType]:
    return [MachineType(f"{prefix}{sep}{size}", vcpus, vcpus * gb_per_vcpu, usd_per_hour=vcpus * usd_per_vcpu_hour)
            for size, vcpus in sizes.items()]


# --- the offline fallback: approximate on-demand prices in us-east-1, us-central1, eastus --------

AWS = [
    *_family("m7i", {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "16xlarge": 64,
                     "48xlarge": 192}, 4, 0.0504),
    MachineType("r7i.16xlarge", 64, 512, usd_per_hour=4.23),
    MachineType("t3.micro", 2, 1, usd_per_hour=0.0104),
    MachineType("g4dn.xlarge", 4, 16, "T4", 1, 0.526),
    MachineType("g4dn.12xlarge", 48, 192, "T4", 4, 3.91),
    MachineType("p4d.24xlarge", 96, 1152, "A100_40G", 8, 32.77),
    MachineType("p4de.24xlarge", 96, 1152, "A100_80G", 8, 40.97),
    MachineType("p5.48xlarge", 192, 2048, "H100_80G", 8, 98.32),
]

GCP = [
    *[MachineType(f"n4-standard-{n}", n, n * 4, usd_per_hour=n * 0.0474) for n in (2, 4, 8, 16, 32, 48, 64, 80)],
    *[MachineType(f"a2-highgpu-{n}g", 12 * n, 85 * n, "A100_40G", n, n * 3.67) for n in (1, 2, 4, 8)],
    *[MachineType(f"a2-ultragpu-{n}g", 12 * n, 170 * n, "A100_80G", n, n * 5.07) for n in (1, 2, 4, 8)],
    MachineType("a3-highgpu-8g", 208, 1872, "H100_80G", 8, 88.25),
]

AZURE = [
    *[MachineType(f"Standard_D{n}as_v5", n, n * 4, usd_per_hour=n * 0.043) for n in (2, 4, 8, 16, 32, 48, 64, 96)],
    MachineType("Standard_NC4as_T4_v3", 4, 28, "T4", 1, 0.526),
    MachineType("Standard_NC64as_T4_v3", 64, 440, "T4", 4, 4.35),
    MachineType("Standard_NC24ads_A100_v4", 24, 220, "A100_80G", 1, 3.67),
    MachineType("Standard_NC96ads_A100_v4", 96, 880, "A100_80G", 4, 14.69),
    MachineType("Standard_ND96asr_v4", 96, 900, "A100_40G", 8, 27.20),
    MachineType("Standard_ND96isr_H100_v5", 96, 1900, "H100_80G", 8, 98.32),
]

OFFLINE = {"aws": AWS, "gcp": GCP, "azure": AZURE}
DEFAULT_MACHINE = {"aws": "m7i.2xlarge", "gcp": "n4-standard-4", "azure": "Standard_D8as_v5"}
GPU_ALIASES = {"A100": "A100_40G", "H100": "H100_80G"}


def gpu_model(name: str) -> str:
    upper = name.upper()
    return GPU_ALIASES.get(upper, upper)


def model_of_reported(reported: str) -> str:
    """A catalog model name for a GPU as a cloud or nvidia-smi names it ('NVIDIA A100-SXM4-80GB',
    'A100 40GB', 'nvidia-tesla-t4') -> A100_80G, A100_40G, T4."""
    upper = reported.upper()
    for model in ("H100", "H200", "A100", "L40S", "L4", "A10G", "A10", "T4", "V100"):
        if re.search(rf"\b{model}\b|{model}[-_ ]", upper) or upper.endswith(model):
            memory = re.search(r"(\d+)\s*GB", upper)
            if model in ("A100", "H100"):
                return f"{model}_{memory.group(1) if memory else ('80' if model == 'H100' else '40')}G"
            return model
    cleaned = re.sub(r"^NVIDIA[\s-]+|^TESLA[\s-]+", "", upper)
    return re.sub(r"[^A-Z0-9]+", "_", cleaned).strip("_") or "UNKNOWN"


def offline_lookup(cloud: str, name: str) -> MachineType | None:
    """A machine type from the offline fallback table (approximate; see the module's docstring)."""
    return next((m for m in OFFLINE.get(cloud, []) if m.name == name), None)
