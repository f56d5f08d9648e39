"""The dashboard in a real headless Chromium (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import functions
from tests.support.helpers import PRELUDE, get_json

CHROMIUM = os.environ.get("BURLA_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "tests" / "artifacts" / "screenshots"

if not Path(CHROMIUM).exists():
    if os.environ.get("BURLA_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"browser tests need Chromium at {CHROMIUM} (apt-get install -y chromium)")
    pytest.skip(f"no Chromium at {CHROMIUM}; `apt-get install -y chromium` runs these", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-sync"],
        )
        yield browser
        browser.close()


def _login_link(head, target: str = "/") -> str:
    request = urllib.request.Request(f"{head.url}/v1/login-link?next={target}", data=b"{}", method="POST",
                                     headers=head.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["url"]


@pytest.fixture
def page(browser, cluster):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(_login_link(cluster))
    yield page
    context.close()


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def _latest_job(head, function_name: str) -> str:
    request = urllib.request.Request(f"{head.url}/v1/jobs?limit=50", headers=head.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        jobs = json.load(response)["jobs"]
    return next(j["job_id"] for j in jobs if j["function_name"] == function_name)


def _running_job(head, function_name: str, timeout: float = 60.0) -> str:
    import time

    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"{head.url}/v1/jobs?status=RUNNING", headers=head.headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            jobs = [j for j in json.load(response)["jobs"] if j["function_name"] == function_name]
        if jobs:
            return jobs[0]["job_id"]
        assert time.monotonic() < deadline, f"no running {function_name} job"
        time.sleep(0.05)


def test_without_a_session_the_dashboard_explains_how_to_sign_in(browser, cluster):
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(f"{cluster.url}/jobs")
    assert response.status == 401
    assert "burla dashboard" in page.content()
    link = _login_link(cluster, "/jobs")
    page.goto(link)
    page.wait_for_selector("h1:has-text('Jobs')")
    second = context.new_page()  # the link works once
    assert second.goto(link).status == 401
    context.close()


def test_cluster_page_shows_the_node(page, cluster):
    page.goto(f"{cluster.url}/")
    page.wait_for_selector("#nodes-table tbody tr[data-node]")
    assert "READY" in page.inner_text("#nodes-table") or "RUNNING" in page.inner_text("#nodes-table")
    _shot(page, "cluster")


def test_jobs_page_shows_progress_advancing(page, cluster, client):
    results: list = []
    runner = threading.Thread(target=lambda: results.extend(client.remote_parallel_map(
        functions.sleep_then_return, [(i, 0.25) for i in range(16)], spinner=False)))
    runner.start()
    try:
        job_id = _running_job(cluster, "sleep_then_return")
        page.goto(f"{cluster.url}/jobs")
        row = f"#jobs-table tr[data-job='{job_id}'] [role=progressbar]"
        page.wait_for_selector(row)
        first = int(page.get_attribute(row, "aria-valuenow"))
        page.wait_for_function(
            """([selector, seen]) => {
                const bar = document.querySelector(selector);
                return bar && Number(bar.getAttribute('aria-valuenow')) > seen;
            }""", arg=[row, first])
        _shot(page, "jobs-running")
    finally:
        runner.join(60)
    assert sorted(results) == list(range(16))
    page.wait_for_function("""(selector) => document.querySelector(selector).getAttribute('aria-valuenow') === '16'""",
                           arg=row)


def test_job_page_shows_a_calls_output(page, cluster, client):
    client.remote_parallel_map(functions.chatty, [11, 12, 13], spinner=False)
    job_id = _latest_job(cluster, "chatty")
    page.goto(f"{cluster.url}/jobs/{job_id}")
    page.wait_for_selector("#count-done:has-text('3/3')")
    page.fill("#output-index", "1")
    # Every call's output shows until the filter's answer replaces it: wait for that answer.
    page.wait_for_function("""() => {
        const text = document.querySelector('#output-results').innerText;
        return text.includes('stdout line from 12') && !text.includes('from 11');
    }""")
    assert "from 13" not in page.inner_text("#output-results")
    page.fill("#output-index", "")
    page.fill("#output-search", "stderr line from 13")
    page.wait_for_selector("#output-results .output-line[data-index='2']")
    _shot(page, "job-output")


def test_failed_calls_show_their_traceback(page, cluster, client):
    client.remote_parallel_map(functions.fail_on, range(5), raise_errors=False, spinner=False)
    job_id = _latest_job(cluster, "fail_on")
    page.goto(f"{cluster.url}/jobs/{job_id}")
    page.click("details.failure[data-index='3'] summary")
    traceback = page.inner_text("details.failure[data-index='3'] pre")
    assert "ValueError: input 3 is bad" in traceback and "fail_on" in traceback
    where = page.inner_text("details.failure[data-index='3'] .where")
    assert where.startswith("on node ") and "worker pid" in where
    _shot(page, "job-failures")


def test_the_job_page_shows_each_calls_record_and_the_jobs_latency(page, cluster, client):
    client.remote_parallel_map(functions.fail_on, range(5), raise_errors=False, spinner=False)
    job_id = _latest_job(cluster, "fail_on")
    page.goto(f"{cluster.url}/jobs/{job_id}")
    page.wait_for_selector("#calls-summary:has-text('5 calls recorded')", timeout=60_000)
    summary = page.inner_text("#calls-summary")
    assert "80.0% succeeded" in summary and "took p50" in summary and "waited p50" in summary
    page.wait_for_selector("#calls-rows tr[data-index='4']", timeout=60_000)
    row = page.inner_text("#calls-rows tr[data-index='3']")
    [node_id] = [node["node_id"] for node in get_json(cluster, "/v1/cluster")["nodes"]]
    assert "failed" in row and node_id in row
    assert "succeeded" in page.inner_text("#calls-rows tr[data-index='2']")
    _shot(page, "job-calls")


def test_a_printed_job_link_opens_that_job_read_only_again_and_again_and_outlives_the_head(browser, tmp_path):
    import re

    from tests.conftest import run_client, start_head, wait_for_nodes

    config_dir = tmp_path / "config"
    head = start_head(config_dir, workers=1)
    try:
        wait_for_nodes(head, 1)
        done = run_client(PRELUDE + "print(remote_parallel_map(functions.double, [1, 2], spinner=False))\n", head.env())
        assert done.returncode == 0, done.stderr
        [(job_id, link)] = re.findall(r"\[burla\] job (\S+): (\S+)", done.stderr)
        assert link.startswith(f"{head.url}/jobs/{job_id}?login=")
        context = browser.new_context()  # no session yet: the link alone signs it in
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(link)
        page.wait_for_selector("#count-done:has-text('2/2')")
        assert page.url == f"{head.url}/jobs/{job_id}"  # the code left the address bar
        page.wait_for_selector("#read-only")  # the job's link reads it: no cancel button
        assert page.locator("#cancel-job").count() == 0
        _shot(page, "job-read-only")
        assert page.goto(f"{head.url}/settings").status == 401  # nothing beyond the job
        colleague = browser.new_context()  # the link opens as often as it is shared, until it expires
        other = colleague.new_page()
        other.goto(link)
        other.wait_for_selector("#count-done:has-text('2/2')")
        colleague.close()
        head.stop()
        head = start_head(config_dir, workers=1)  # same token: the browser's session still holds
        page.goto(f"{head.url}/jobs/{job_id}")
        page.wait_for_selector("#count-done:has-text('2/2')")
        context.close()
    finally:
        head.stop()


def test_cancel_button_stops_the_job(page, cluster):
    script = PRELUDE + "remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(4)])\n"
    client = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ, **cluster.env()),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job_id = _running_job(cluster, "sleep_then_return")
        page.goto(f"{cluster.url}/jobs")
        page.click(f"#jobs-table tr[data-job='{job_id}'] a")
        page.wait_for_selector("#count-running:not(:has-text('0'))")
        _shot(page, "job-running")
        page.click("#cancel-job")
        page.wait_for_selector("#job-status:has-text('CANCELED')")
        page.wait_for_selector("#count-running:has-text('0')")
        _shot(page, "job-canceled")
    finally:
        client.wait(60)


def test_settings_page_saves(page, cluster):
    page.goto(f"{cluster.url}/settings")
    page.fill("input[name=region]", "us-east-2")
    page.click("#save-settings")
    page.wait_for_selector("#settings-message:has-text('Saved')")
    request = urllib.request.Request(f"{cluster.url}/v1/settings", headers=cluster.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.load(response)["region"] == "us-east-2"
    _shot(page, "settings")


def test_job_page_shows_its_nested_jobs(page, cluster, client):
    assert client.remote_parallel_map(functions.nested_sum, [2], spinner=False) == [2]
    parent_id = _latest_job(cluster, "nested_sum")
    child_id = _latest_job(cluster, "double")
    page.goto(f"{cluster.url}/jobs/{parent_id}")
    page.wait_for_selector(f"#jobs-table tr[data-job='{child_id}']")
    page.goto(f"{cluster.url}/jobs/{child_id}")
    page.wait_for_selector(f"a[href='/jobs/{parent_id}']")  # and the child links back to its parent
    page.goto(f"{cluster.url}/jobs")
    page.wait_for_selector(f"#jobs-table tr[data-job='{child_id}'] td.child")  # nested under its parent
    _shot(page, "jobs-nested")
