"""GPUs: a node finds its NVIDIA GPUs with nvidia-smi (a stand-in script on PATH here, printing
what the real one prints), and each call of a job with func_gpu gets one of its own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from burla.drivers.catalog import model_of_reported
from burla.node.gpus import Gpus, detect
from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support import functions
from tests.support.helpers import get_json, wait_until


def _fake_nvidia_smi(directory, names: list[str], exit_code: int = 0):
    """An `nvidia-smi` that answers the two queries a node makes as the real one does: the GPUs'
    names, and each GPU's utilisation (37 %) and memory (1,024 of 40,960 MiB)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    listing = "".join(f"echo '{name}'\n" for name in names)
    usage = "echo '37, 1024, 40960'\n" * len(names)
    script.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = '--query-gpu=name' ]; then\n{listing}exit {exit_code}\nfi\n"
        f"if [ \"$1\" = '--query-gpu=utilization.gpu,memory.used,memory.total' ]; then\n{usage}exit {exit_code}\nfi\n"
        "exit 2\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return directory


@pytest.mark.parametrize("reported, model", [
    ("NVIDIA A100-SXM4-40GB", "A100_40G"), ("NVIDIA A100-SXM4-80GB", "A100_80G"),
    ("NVIDIA H100 80GB HBM3", "H100_80G"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 4090", "GEFORCE_RTX_4090"),
    # as the clouds' machine lists name them: EC2 (name and memory), GCE accelerator types
    ("A100 40GB", "A100_40G"), ("A100 80GB", "A100_80G"), ("T4 16GB", "T4"), ("A10G 24GB", "A10G"),
    ("nvidia-tesla-a100", "A100_40G"), ("nvidia-a100-80gb", "A100_80G"), ("nvidia-h100-80gb", "H100_80G"),
    ("nvidia-l4", "L4"), ("nvidia-tesla-t4", "T4"),
])
def test_reported_names_become_catalog_models(reported, model):
    assert model_of_reported(reported) == model


def test_detection_reads_nvidia_smi_and_tolerates_its_absence_or_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path / "two", ["NVIDIA A100-SXM4-40GB"] * 2)))
    assert detect() == Gpus("A100_40G", 2)
    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path / "broken", ["NVIDIA T4"], exit_code=9)))
    assert detect() == Gpus(None, 0)  # a driver that fails: no GPU, no crash
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert detect() == Gpus(None, 0)


def test_a_node_offers_its_gpus_and_each_gpu_call_gets_one_of_its_own(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=0)
    client = head.client()
    fake = _fake_nvidia_smi(tmp_path / "bin", ["NVIDIA A100-SXM4-40GB"] * 2)
    env = dict(os.environ, **head.env(), PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:  # three workers, two GPUs
        node = subprocess.Popen([sys.executable, "-m", "burla", "node", "join", "--head", head.url, "--workers", "3"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for_nodes(head, 1)
        [registered] = get_json(head, "/v1/cluster")["nodes"]
        assert (registered["gpu"], registered["gpu_count"]) == ("A100_40G", 2)
        seen = client.remote_parallel_map(functions.visible_gpu, [0.3] * 8, func_gpu="A100", spinner=False)
        assert set(seen) == {"0", "1"}  # two at a time, each on its own GPU, never on the worker without one
        # A job without func_gpu runs on every worker; the third sees no GPU.
        seen = client.remote_parallel_map(functions.visible_gpu, [0.3] * 9, spinner=False)
        assert set(seen) == {"0", "1", ""}
        # A worker that dies gives its GPU to its replacement.
        client.remote_parallel_map(functions.exit_hard, [1], raise_errors=False, spinner=False)
        seen = client.remote_parallel_map(functions.visible_gpu, [0.3] * 8, func_gpu="A100", spinner=False)
        assert set(seen) == {"0", "1"}
        # Utilisation and memory reach the node's view and the job's metrics.
        wait_until(lambda: get_json(head, "/v1/cluster")["nodes"][0]["gpu_percent"] == 37.0, timeout=30,
                   what="the node's GPU utilisation")
        assert get_json(head, "/v1/cluster")["nodes"][0]["gpu_mem_percent"] == 2.5
        job_id = next(j["job_id"] for j in get_json(head, "/v1/jobs")["jobs"] if j["function_name"] == "visible_gpu")

        def gpu_samples() -> list:
            nodes = get_json(head, f"/v1/jobs/{job_id}/metrics")["nodes"]
            return [sample for samples in nodes.values() for sample in samples if sample["gpu_percent"] == 37.0]

        wait_until(gpu_samples, timeout=30, what="GPU samples in the job's metrics")
        _the_dashboard_charts_gpus(head, job_id)
    finally:
        node.terminate()
        node.wait(15)
        head.stop()


def _the_dashboard_charts_gpus(head, job_id: str) -> None:
    chromium = os.environ.get("BURLA_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        if os.environ.get("BURLA_REQUIRE_BROWSER") == "1":
            raise RuntimeError(f"browser checks need Chromium at {chromium}")
        return
    from playwright.sync_api import sync_playwright

    from burla.web.login_links import link_code

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{head.url}/jobs/{job_id}?login={link_code(head.token, f'/jobs/{job_id}')}")
            page.wait_for_selector("#gpu-chart:not([hidden]) svg")
            assert "GPU per node" in page.inner_text("#gpu-chart")
        finally:
            browser.close()
