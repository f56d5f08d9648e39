"""No job's call runs in a process that ran another client's call: workers are one tenant's
(its client process's jobs) for their whole life, fresh from the fork server."""

from __future__ import annotations

import json

from tests.conftest import own_head, run_client
from tests.support.helpers import PRELUDE


def _run(head, body: str) -> list:
    done = run_client(PRELUDE + "import json, os\n" + body, head.env())
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


def test_a_call_that_hooks_its_worker_never_meets_the_next_clients_job(tmp_path):
    with own_head(tmp_path, local_nodes=1, workers=2) as head:
        hook = f"remote_parallel_map(functions.plant_hook, [{str(tmp_path)!r}] * 4, spinner=False)"
        [hooked_pids] = _run(head, f"print(json.dumps({hook}))")
        [results] = _run(head, "print(json.dumps(remote_parallel_map(functions.doubled_with_pid, [1, 2, 3, 4],"
                               " spinner=False)))")
        assert [value for value, _ in results] == [2, 4, 6, 8]  # not "TAMPERED"
        assert not {pid for _, pid in results} & set(hooked_pids)  # in processes that never ran the hook
        assert not (tmp_path / "hooked.log").exists()  # it saw neither the inputs nor the job token


def test_a_clients_next_job_runs_warm_and_another_clients_does_not(tmp_path):
    with own_head(tmp_path, local_nodes=1, workers=2) as head:
        job = "[pid for _, pid in remote_parallel_map(functions.doubled_with_pid, [1, 2], spinner=False)]"
        other_function = "[pid for _, pid in remote_parallel_map(functions.tagged_pid, [1, 2], spinner=False)]"
        first, second, third = _run(head, f"print(json.dumps({job}))\nprint(json.dumps({job}))\n"
                                          f"print(json.dumps({other_function}))")
        assert set(second) <= set(first)  # the same processes: what the first job loaded stays loaded
        assert set(third) <= set(first)  # the same client's other function too
        [other] = _run(head, f"print(json.dumps({job}))")  # the same function, from another process
        assert not set(other) & set(first)
