"""Which nodes may run a job, how many of its calls at once, each node's share of it, and, when
none can, why: pure functions of a node's record and the job's."""

from __future__ import annotations

from collections.abc import Iterable

from burla.config import MAX_CALLS_PER_SLOT
from burla.drivers.catalog import gpu_model
from burla.head.scheduling.records import JobRecord, NodeRecord
from burla.protocol import wire


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def ineligibility(node: NodeRecord, spec: wire.OpenJob) -> str | None:
    """Why this node can't run the job, or None if it can."""
    if _major_minor(node.python_version) != _major_minor(spec.python_version):
        return "python"
    if spec.func_gpu is not None and gpu_model(node.gpu or "") != gpu_model(spec.func_gpu):
        return "gpu"
    if spec.image is not None and not _runs_image(node, spec.image):
        return "image"
    if spec.region is not None and node.region != spec.region:
        return "region"
    if node_parallelism(node, spec) < 1:
        return "capacity"
    return None


def can_join(node: NodeRecord, spec: wire.OpenJob) -> bool:
    """Whether a node may take part in an admitted job: it meets the job's requirements and,
    for a job whose inputs go by file, shares the client's machine."""
    if spec.client_host and node.host_id != spec.client_host:
        return False
    return ineligibility(node, spec) is None


def node_parallelism(node: NodeRecord, spec: wire.OpenJob) -> int:
    """At most how many calls of the job may run on the node at once. With func_cpu="dynamic"
    that is MAX_CALLS_PER_SLOT per slot: the node runs more than a call per slot only while
    its CPUs show room (burla/node/governor.py)."""
    parallelism = node.slots
    if spec.func_gpu is not None:
        parallelism = min(parallelism, node.gpu_count)
    elif spec.func_cpu is None:
        parallelism = node.slots * MAX_CALLS_PER_SLOT
    if spec.func_cpu is not None:
        parallelism = min(parallelism, node.cpus // spec.func_cpu)
    if spec.func_ram is not None:
        parallelism = min(parallelism, int(node.ram_gb // spec.func_ram))
    return parallelism


class Given:
    """What a job's assignments give out in all, kept up to date through a pass that adds
    assignments: summed again for every node, admitting a job on N nodes was O(N²) (40 ms at
    1,000 nodes, one step of the head's loop)."""

    __slots__ = ("parallelism", "slots")

    def __init__(self, job: JobRecord) -> None:
        self.parallelism = sum(a.parallelism for a in job.assignments.values())
        self.slots = sum(a.slots for a in job.assignments.values())

    def add(self, parallelism: int, slots: int) -> None:
        self.parallelism += parallelism
        self.slots += slots


def share(node: NodeRecord, ceiling: int, job: JobRecord, given: Given, holding: bool = False) -> tuple[int, int]:
    """A node's (parallelism, slots) in a job beside the shares it already gave out, (0, 0) for
    none: a call per slot while the job has inputs for more slots (a one-call job is assigned to
    one node, not announced to every node), up to `ceiling` calls at once (node_parallelism:
    calls that wait share CPUs), and never past max_parallelism in all (`given`: what the job's
    assignments give out already; the caller adds what this returns). `holding`: the node
    kept running inputs of the job while it had no head; it takes part whatever the caps say,
    or what it holds would be cancelled there and run again elsewhere."""
    spec = job.spec
    parallelism = min(ceiling, spec.n_inputs)
    slots = min(node.slots, parallelism, spec.n_inputs - given.slots)
    if spec.max_parallelism is not None:
        parallelism = min(parallelism, spec.max_parallelism - given.parallelism)
        slots = min(slots, parallelism)
    if holding:
        slots = max(slots, min(node.slots, ceiling))
        parallelism = max(parallelism, slots)
    return (parallelism, slots) if slots >= 1 else (0, 0)


def image_of(node: NodeRecord) -> str:
    """The image a node's calls run in: its own, or for a node without one, the `python:3.X` of
    its interpreter (what such a node stands for, as the user guide says)."""
    return node.image or f"python:{_major_minor(node.python_version)}"


def _runs_image(node: NodeRecord, image: str) -> bool:
    """Whether a node runs `image`: its own, or a node without one for `python:3.X` of its Python
    (with any suffix: `python:3.11-slim` is that Python too)."""
    if node.image is not None:
        return node.image == image
    wanted = f"python:{_major_minor(node.python_version)}"
    return image == wanted or image.startswith(wanted + "-")


def _boot_hint(spec: wire.OpenJob, what: str, cloud: str | None) -> str:
    """How to get nodes with `what`: grow on this cluster's cloud, or configure one first."""
    if cloud is None:
        return (f"this cluster runs on this machine and boots no VMs: to boot {what}, choose a cloud with "
                "`burla config set cloud aws` (or gcp, azure) and run the job with grow=True")
    if not spec.grow:
        return f"pass grow=True to boot {what} on {cloud}"
    return f"grow=True found no way to boot {what} on {cloud} (see `burla cluster events`)"


def placement_order(eligible: list[tuple[NodeRecord, int]], running: Iterable[JobRecord]
                    ) -> list[tuple[NodeRecord, int]]:
    """Eligible (node, ceiling) pairs in the order a new job's shares go out: the least-loaded
    nodes first (slots the running jobs hold there, per slot it has), so capped jobs started
    together spread over the cluster; then those that run the most calls at once."""
    held: dict[str, int] = {}
    for job in running:
        for node_id, assignment in job.assignments.items():
            held[node_id] = held.get(node_id, 0) + assignment.slots
    return sorted(eligible, key=lambda e: (held.get(e[0].node_id, 0) / max(1, e[0].slots), -e[1]))


def no_nodes_message(spec: wire.OpenJob, cloud: str | None) -> str:
    grow = f", pass grow=True to boot what the job needs on {cloud}" if cloud and not spec.grow else ""
    return (f"This cluster has no nodes. Run `burla cluster start`{grow}, join one with `burla node join --head URL`, "
            "or start the head with `burla head serve --local-nodes 1`.")


def explain(spec: wire.OpenJob, reasons: dict[str, list[NodeRecord]], n_nodes: int, cloud: str | None = None) -> str:
    """Why none of the cluster's `n_nodes` nodes can run the job, a line per reason with what to do
    (`cloud`: the cloud this head boots VMs on, None for none)."""
    lines = [f"None of the cluster's {n_nodes} node(s) can run this job:"]
    if "python" in reasons:
        versions = sorted({_major_minor(node.python_version) for node in reasons["python"]})
        lines.append(
            f"- the client runs Python {_major_minor(spec.python_version)} but the nodes run "
            f"Python {', '.join(versions)}; run the client with a matching Python or start nodes "
            f"with Python {_major_minor(spec.python_version)}."
        )
    if "gpu" in reasons:
        have = sorted({node.gpu or "no GPU" for node in reasons["gpu"]})
        lines.append(
            f"- func_gpu={spec.func_gpu!r} but the nodes have {', '.join(have)}; "
            f"{_boot_hint(spec, f'{spec.func_gpu} GPU nodes', cloud)}, or drop func_gpu."
        )
    if "image" in reasons:
        have = sorted({image_of(node) for node in reasons["image"]})
        lines.append(
            f"- image={spec.image!r} but the nodes run {', '.join(have)}; "
            f"{_boot_hint(spec, 'nodes with that image', cloud)}, or drop image."
        )
    if "region" in reasons:
        have = sorted({node.region for node in reasons["region"]})
        lines.append(
            f"- region={spec.region!r} but the nodes are in {', '.join(have)}; "
            f"{_boot_hint(spec, 'nodes there', cloud)}, or drop region."
        )
    if "capacity" in reasons:
        biggest = max(reasons["capacity"], key=lambda node: (node.cpus, node.ram_gb))
        asked = []
        if spec.func_cpu is not None:
            asked.append(f"func_cpu={spec.func_cpu}")
        if spec.func_ram is not None:
            asked.append(f"func_ram={spec.func_ram:g}")
        lines.append(
            f"- one call needs {' and '.join(asked) or 'more than a node has'} but the largest node "
            f"has {biggest.cpus} CPUs and {biggest.ram_gb:.0f} GB; lower them, or "
            f"{_boot_hint(spec, 'bigger machines', cloud)}."
        )
    if "host" in reasons:
        lines.append(
            "- the job's inputs travel as files on the client's machine, and no node on that machine is left; "
            "run the job again (its inputs then go over the network to the other nodes)."
        )
    return "\n".join(lines)
