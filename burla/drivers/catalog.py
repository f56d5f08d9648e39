"""Machine catalogs per cloud (vCPUs, memory, GPUs): slot counts for nodes, and what grow boots."""

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
    usd_per_hour: float = 0.0  # on-demand list price, approximate (us-east-1, us-central1, eastus)

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

CATALOGS = {"aws": AWS, "gcp": GCP, "azure": AZURE}
DEFAULT_MACHINE = {"aws": "m7i.2xlarge", "gcp": "n4-standard-4", "azure": "Standard_D8as_v5"}
GPU_ALIASES = {"A100": "A100_40G", "H100": "H100_80G"}


def gpu_model(name: str) -> str:
    upper = name.upper()
    return GPU_ALIASES.get(upper, upper)


def lookup(cloud: str, name: str) -> MachineType | None:
    return next((m for m in CATALOGS.get(cloud, []) if m.name == name), None)
