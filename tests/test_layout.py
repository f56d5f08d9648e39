"""The package's shape, checked: DESIGN.md's layout section lists every module as it is, no module
is past 500 lines, imports form no circle, the shared folders import no role, no module imports
another's private names, and each concept's fields keep one name from record to record."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from tests.layout import DESIGN, PACKAGE, modules, render, section

MAX_LINES = 500
ROLES = ("client", "head", "node", "cli", "drivers")
# What every role may import: the wire and its records, HTTP and process plumbing, settings, errors.
SHARED = ("protocol", "web", "process", "config", "errors", "_version")


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_name(path): path for path in modules()}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import of a module, wherever it stands (type checking and
    function-local imports too: a circle through them is still a circle)."""
    found = []
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in NAMES.items():
        edges = set()
        for module, names in _imports(path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in NAMES] or [module]
            for target in targets:
                while target not in NAMES and "." in target:
                    target = target.rpartition(".")[0]
                if target in NAMES and target not in (name, "burla"):
                    edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for edge in edges:
                if edge not in index:
                    index[edge] = low[edge] = len(index)
                    stack.append(edge)
                    on_stack.add(edge)
                    work.append((edge, iter(sorted(graph[edge]))))
                    break
                if edge in on_stack:
                    low[node] = min(low[node], index[edge])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_design_md_lists_every_module_with_what_it_is():
    current = section(DESIGN.read_text(encoding="utf-8"))
    assert current, "DESIGN.md lost its layout markers"
    assert current == render(), "DESIGN.md's layout is stale: run `python3 -m tests.layout --write`"


def test_every_module_says_what_it_is():
    missing = [name for name, path in NAMES.items() if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"


def test_no_module_is_past_500_lines():
    long = {name: n for name, path in NAMES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by role: {long}"


def test_imports_form_no_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_shared_folders_import_no_role():
    crossing = sorted(
        (name, target) for name, targets in _graph().items() if name.split(".")[1:2][0:1] and
        name.split(".")[1] in SHARED for target in targets if target.split(".")[1] in ROLES
    )
    assert crossing == []


def test_no_module_imports_another_modules_private_names():
    private = sorted(
        (name, module, imported) for name, path in NAMES.items() for module, names in _imports(path)
        if module.startswith("burla") for imported in names if imported.startswith("_") and imported != "__version__"
    )
    assert private == []


def test_a_jobs_options_keep_their_names_from_the_user_to_the_node():
    from burla.protocol import wire
    from burla.protocol.job_options import OPTION_FIELDS, JobOptions

    opening = wire.OpenJob.FIELDS
    start = opening.index(OPTION_FIELDS[0])
    assert opening[start:start + len(OPTION_FIELDS)] == OPTION_FIELDS  # in one run, in JobOptions' order
    hints = {f.name: f.type for f in dataclasses.fields(JobOptions)}
    annotations = wire.OpenJob.__annotations__
    assert {name: annotations[name] for name in OPTION_FIELDS} == hints
    assigned = [name for name in wire.AssignJob.FIELDS if name.startswith("func_")]
    assert assigned and set(assigned) <= set(OPTION_FIELDS)
    options = JobOptions.checked(func_cpu=2, func_ram=1.5, func_gpu="T4", max_parallelism=3, detach=True)
    assert wire.OpenJob(job_id="j", function_name="f", function_bytes=b"", n_inputs=1, **options.fields(),
                        client_version="0", python_version="3", local_code=b"", packages={}).options == options


def test_a_nodes_fields_keep_their_names_from_registration_to_view():
    from burla.head.scheduling.records import NodeRecord
    from burla.protocol import wire
    from burla.protocol.views import DESCRIPTION_FIELDS, NODE_FIELDS, USAGE_FIELDS, NodeDescription, NodeUsage, NodeView

    # The description and usage are declared once; the record and the view are made of both.
    assert issubclass(NodeRecord, NodeDescription) and issubclass(NodeRecord, NodeUsage)
    assert issubclass(NodeView, NodeDescription) and issubclass(NodeView, NodeUsage)
    assert set(NODE_FIELDS) == {*DESCRIPTION_FIELDS, *USAGE_FIELDS, "jobs"}
    # The wire carries them under the same names and types.
    described = {f.name: f.type for f in dataclasses.fields(NodeDescription)}
    assert {name: wire.RegisterNode.__annotations__[name] for name in DESCRIPTION_FIELDS} == described
    assert set(USAGE_FIELDS) - {"status"} <= set(wire.NodeState.FIELDS)
    record = {f.name for f in dataclasses.fields(NodeRecord)}
    assert set(wire.RegisterNode.FIELDS) - {"build", "held", "session_proof"} <= record  # those only checked
