"""remote_parallel_map against a real head, node and workers."""

from __future__ import annotations

import os
import socket
import traceback

import pytest

from burla import (
    FunctionTooBig,
    InputTooBig,
    InvalidArgument,
    NoCompatibleNodes,
    RemoteError,
    UnpicklableFunction,
    UnpicklableInput,
    WorkerCrashed,
)
from tests.conftest import run_client
from tests.support import functions
from tests.support.helpers import PRELUDE, get_json, wait_until


def test_results_come_back_in_input_order(client):
    inputs = list(range(500))
    assert client.remote_parallel_map(functions.double, inputs, spinner=False) == [x * 2 for x in inputs]


def test_tuples_unpack_and_nested_tuples_pass_whole(client):
    results = client.remote_parallel_map(functions.identity, [(1, 2), ((1, 2),), [3, 4], 5], spinner=False)
    assert results == [(1, 2), ((1, 2),), ([3, 4],), (5,)]


def test_empty_inputs(client):
    assert client.remote_parallel_map(functions.double, []) == []
    assert list(client.remote_parallel_map(functions.double, [], generator=True)) == []


def test_any_iterable_of_inputs(client):
    assert client.remote_parallel_map(functions.double, (x for x in range(5)), spinner=False) == [0, 2, 4, 6, 8]


def test_generator_yields_every_result(client):
    stream = client.remote_parallel_map(functions.double, range(50), generator=True, spinner=False)
    assert not isinstance(stream, list)
    assert sorted(stream) == [x * 2 for x in range(50)]


def test_exception_reraises_with_type_index_and_remote_traceback(cluster, client):
    with pytest.raises(ValueError, match="input 3 is bad") as caught:
        client.remote_parallel_map(functions.fail_on, range(6), spinner=False)
    error = caught.value
    assert error.burla_input_index == 3
    shown = "".join(traceback.format_exception(error))
    assert "fail_on" in shown and "functions.py" in shown
    assert 'raise ValueError(f"input {x} is bad")' in shown  # source line of the remote frame
    assert "fail_on" in error.burla_traceback
    # Where it failed: a PEP 678 note shown under the traceback, and attributes.
    [node_id] = [node["node_id"] for node in get_json(cluster, "/v1/cluster")["nodes"]]
    assert error.burla_node_id == node_id and error.burla_host == socket.gethostname() and error.burla_worker_pid > 0
    note = f"[burla] failed on input index 3 on node {node_id} (host {socket.gethostname()}, worker pid "
    assert error.__notes__[-1].startswith(note) and note in shown


def test_a_remote_traceback_starts_at_the_users_code(client):
    # Fails on the previous code: five frames of burla's client stood between the user's line and
    # the call's own frames.
    with pytest.raises(ValueError) as caught:
        client.remote_parallel_map(functions.fail_on, range(6), spinner=False)
    files = [frame.filename for frame in traceback.extract_tb(caught.value.__traceback__)]
    burlas = [name for name in files if f"{os.sep}burla{os.sep}" in name]
    assert len(burlas) == 1 and burlas[0].endswith("tracebacks.py"), files  # where the call entered burla
    assert files[-1].endswith("functions.py")
    stream = client.remote_parallel_map(functions.fail_on, range(6), generator=True, spinner=False)
    with pytest.raises(ValueError) as caught:
        list(stream)
    files = [frame.filename for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert len([name for name in files if f"{os.sep}burla{os.sep}" in name]) == 1, files


def test_sys_exit_in_a_call_fails_that_call_not_the_client(cluster):
    # Fails on the previous code: the client itself exited with the call's code 2, silently.
    script = PRELUDE + (
        "import sys\n"
        "from burla import CallExited\n"
        "try:\n"
        "    remote_parallel_map(sys.exit, [None], spinner=False)\n"
        "except CallExited as e:\n"
        "    print('call failed:', e.burla_input_index, e)\n"
        "print(remote_parallel_map(sys.exit, [3, 2], spinner=False, raise_errors=False))\n"
    )
    done = run_client(script, cluster.env())
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first.startswith("call failed: 0 ") and "sys.exit()" in first  # an exit of any code fails its call
    assert second.count("CallExited") == 2 and "sys.exit(3)" in second and "sys.exit(2)" in second


def test_custom_exception_keeps_its_fields(client):
    with pytest.raises(functions.CustomError) as caught:
        client.remote_parallel_map(functions.raise_custom, [41], spinner=False)
    assert caught.value.code == 41 and caught.value.detail == "custom detail"
    assert caught.value.burla_input_index == 0


def test_unpicklable_exception_arrives_as_remote_error(client):
    with pytest.raises(RemoteError) as caught:
        client.remote_parallel_map(functions.raise_unpicklable, [0], spinner=False)
    assert "Unpicklable" in caught.value.type_name
    assert "carries a lock" in str(caught.value)
    assert caught.value.burla_input_index == 0


def test_raise_errors_false_puts_exceptions_in_place(client):
    results = client.remote_parallel_map(functions.fail_on, range(8), raise_errors=False, spinner=False)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    assert isinstance(results[3], ValueError) and results[3].burla_input_index == 3


def test_generator_raises_at_the_failed_call(client):
    stream = client.remote_parallel_map(functions.fail_on, [0, 3], generator=True, spinner=False)
    with pytest.raises(ValueError):
        list(stream)


def test_unpicklable_result_is_a_clear_error(client):
    # A lambda can't go through plain pickle; cloudpickle takes it by value.
    results = client.remote_parallel_map(functions.returns_lambda, [7], spinner=False)
    assert results[0]() == 7


def test_prints_from_python_c_and_subprocesses_reach_the_client(cluster):
    script = (
        "from burla import remote_parallel_map\n"
        "from tests.support import functions\n"
        "import cloudpickle; cloudpickle.register_pickle_by_value(functions)\n"
        "print(remote_parallel_map(functions.chatty, [1, 2], spinner=False))\n"
    )
    done = run_client(script, cluster.env())
    assert done.returncode == 0, done.stderr
    for i in (1, 2):
        assert f"stdout line from {i}" in done.stdout
        assert f"fd write from {i}" in done.stdout
        assert f"subprocess output from {i}" in done.stdout
        assert f"stderr line from {i}" in done.stderr
        assert f"stderr line from {i}" not in done.stdout
    assert "[1, 2]" in done.stdout
    assert "[burla]" not in done.stdout  # no progress line when stdout is not a TTY


def test_a_client_that_exits_right_after_its_results_leaves_its_job_completed(cluster):
    # The last acknowledgement may still be on its way when the caller has its results; it must
    # reach the head before the process is gone, even one that ends with os._exit (no atexit).
    script = (PRELUDE + "import os\n"
              "print(remote_parallel_map(functions.double, [1, 2, 3], spinner=False), flush=True)\nos._exit(0)\n")
    done = run_client(script, cluster.env())
    assert done.returncode == 0, done.stderr
    job_ids = [line.split()[2].rstrip(":") for line in done.stderr.splitlines() if line.startswith("[burla] job ")]
    assert len(job_ids) == 1
    wait_until(lambda: _job_status(cluster, job_ids[0]) != "RUNNING", what="the job ended on the head")
    assert _job_status(cluster, job_ids[0]) == "COMPLETED"


def _job_status(head, job_id: str) -> str:
    return next(j["status"] for j in get_json(head, "/v1/cluster")["jobs"] if j["job_id"] == job_id)


def test_a_call_printing_megabytes_neither_blocks_nor_loses_output(cluster):
    script = (
        "from burla import remote_parallel_map\n"
        "from tests.support import functions\n"
        "import cloudpickle; cloudpickle.register_pickle_by_value(functions)\n"
        "print(remote_parallel_map(functions.print_a_lot, [3], spinner=False))\n"
    )
    done = run_client(script, cluster.env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("x" * 1023 + "\n") == 3 * 1024


def test_max_parallelism_caps_concurrent_calls(client, tmp_path):
    inputs = [(str(tmp_path), i) for i in range(6)]
    client.remote_parallel_map(functions.record_interval, inputs, max_parallelism=1, spinner=False)
    assert functions.max_overlap(tmp_path) == 1


def test_all_slots_are_used_without_a_cap(client, tmp_path):
    # The node has two workers: two calls meet (one slot alone would wait out record_meeting's
    # give-up, alone); calls that wait may also share them.
    inputs = [(str(tmp_path), i, 2, 0.5) for i in range(4)]
    client.remote_parallel_map(functions.record_meeting, inputs, spinner=False)
    assert functions.max_overlap(tmp_path) >= 2


def test_integer_func_cpu_lowers_calls_per_node(cluster, client, tmp_path):
    cpus = cluster_node(cluster)["cpus"]
    inputs = [(str(tmp_path), i) for i in range(4)]
    client.remote_parallel_map(functions.record_interval, inputs, func_cpu=cpus, spinner=False)
    assert functions.max_overlap(tmp_path) == 1


def cluster_node(head) -> dict:
    from tests.conftest import wait_for_nodes

    return wait_for_nodes(head, 1)[0]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"func_gpu": "A100"}, ["func_gpu='A100'", "grow=True"]),
        ({"image": "python:3.12-cuda"}, ["image='python:3.12-cuda'", "grow=True"]),
        ({"region": "mars-north-1"}, ["region='mars-north-1'", "local"]),
        ({"func_ram": 100_000}, ["func_ram=100000", "lower them"]),
        ({"func_cpu": 4096}, ["func_cpu=4096", "CPUs"]),
    ],
)
def test_unsatisfiable_requirements_raise_no_compatible_nodes(client, kwargs, words):
    with pytest.raises(NoCompatibleNodes) as caught:
        client.remote_parallel_map(functions.double, [1], spinner=False, **kwargs)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"func_cpu": 0},
        {"func_cpu": 1.5},
        {"func_cpu": "lots"},
        {"func_ram": -1},
        {"func_ram": 5e-324},  # would make a node's RAM over it infinite
        {"func_ram": float("nan")},
        {"func_ram": float("inf")},
        {"func_gpu": "V100"},
        {"max_parallelism": 0},
        {"max_parallelism": True},
        {"disk_gb": "big"},
        {"image": ""},
    ],
)
def test_bad_arguments_raise_invalid_argument(client, kwargs):
    with pytest.raises(InvalidArgument):
        client.remote_parallel_map(functions.double, [1], **kwargs)


def test_non_callable_and_bad_inputs(client):
    with pytest.raises(InvalidArgument, match="callable"):
        client.remote_parallel_map(42, [1])
    with pytest.raises(InvalidArgument, match="inputs"):
        client.remote_parallel_map(functions.double, 5)
    with pytest.raises(InvalidArgument, match="inputs"):
        client.remote_parallel_map(functions.double, "abc")


def test_function_too_big(client):
    blob = os.urandom(101 * 1024 * 1024)

    def big(x):
        return len(blob) + x

    with pytest.raises(FunctionTooBig, match="100 MB"):
        client.remote_parallel_map(big, [1])


def test_input_too_big_names_its_index(client):
    small = b"x"
    huge = bytes(201 * 1024 * 1024)
    with pytest.raises(InputTooBig) as caught:
        client.remote_parallel_map(len, [small, huge], spinner=False)
    assert caught.value.input_index == caught.value.burla_input_index == 1
    # The cluster is fine afterwards.
    assert client.remote_parallel_map(functions.double, [1], spinner=False) == [2]


def test_unpicklable_function_names_the_culprit(client):
    with pytest.raises(UnpicklableFunction, match="LOCK"):
        client.remote_parallel_map(functions.uses_lock, [1])


def test_unpicklable_input_names_its_index(cluster, client):
    import threading

    jobs_before = len(get_json(cluster, "/v1/cluster")["jobs"])
    with pytest.raises(UnpicklableInput) as caught:
        client.remote_parallel_map(functions.double, [1, 2, threading.Lock()], spinner=False)
    assert caught.value.input_index == caught.value.burla_input_index == 2
    # It was among the first inputs, pickled before the job opens: no job was left on the head.
    assert len(get_json(cluster, "/v1/cluster")["jobs"]) == jobs_before


def test_worker_that_exits_is_replaced_and_the_job_goes_on(client):
    results = client.remote_parallel_map(functions.exit_hard, range(6), raise_errors=False, spinner=False)
    assert [r for i, r in enumerate(results) if i != 1] == [0, 2, 3, 4, 5]
    assert isinstance(results[1], WorkerCrashed)
    assert results[1].input_index == 1 and results[1].burla_input_index == 1
    assert results[1].burla_node_id and results[1].burla_worker_pid > 0  # the worker that died
    assert results[1].__notes__[-1].startswith(f"[burla] failed on input index 1 on node {results[1].burla_node_id}")
    assert "exit code 13" in str(results[1])
    # Both workers are back and serve the next job.
    assert sorted(set(client.remote_parallel_map(functions.pid, range(40), spinner=False))) != []


def test_segfault_raises_worker_crashed(client):
    with pytest.raises(WorkerCrashed) as caught:
        client.remote_parallel_map(functions.segfault, [0, 1], spinner=False)
    assert caught.value.input_index == 0
    assert "SIGSEGV" in str(caught.value)


def test_killed_worker_raises_worker_crashed_naming_the_signal(client):
    results = client.remote_parallel_map(functions.kill_self, range(3), raise_errors=False, spinner=False)
    assert results[1:] == [1, 2]
    assert isinstance(results[0], WorkerCrashed) and "SIGKILL" in str(results[0])


def test_retries_run_a_failed_call_again_until_it_succeeds(client, tmp_path):
    # Fails on the previous code: no retries (a flaky call failed its job).
    results = client.remote_parallel_map(functions.fail_first_tries, [(str(tmp_path), i, 2) for i in range(4)],
                                         retries=2, spinner=False)
    assert results == [0, 1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{i}-{t}" for i in range(4) for t in (1, 2, 3))


def test_the_last_tries_exception_is_raised_with_how_many_tries_there_were(client, tmp_path):
    with pytest.raises(ValueError, match="failed on try 2") as caught:
        client.remote_parallel_map(functions.fail_first_tries, [(str(tmp_path), 0, 5)], retries=1, spinner=False)
    assert caught.value.burla_input_index == 0 and caught.value.burla_attempts == 2
    assert "after 2 attempts" in caught.value.__notes__[-1]


def test_a_call_past_its_timeout_is_stopped_and_fails_with_call_timeout(client):
    from burla import CallTimeout

    results = client.remote_parallel_map(functions.sleep_then_return, [(0, 0.05), (1, 120)], timeout=2,
                                         raise_errors=False, spinner=False)
    assert results[0] == 0
    assert isinstance(results[1], CallTimeout) and results[1].burla_input_index == 1 and "2 s" in str(results[1])
    # Its worker was replaced: the cluster runs the next job on every slot.
    assert client.remote_parallel_map(functions.double, range(8), spinner=False) == [x * 2 for x in range(8)]


def test_a_call_that_timed_out_runs_again_when_retries_remain(client, tmp_path):
    results = client.remote_parallel_map(functions.fail_first_tries, [(str(tmp_path), 7, 1, 120)], timeout=2,
                                         retries=1, spinner=False)
    assert results == [7]


@pytest.mark.parametrize("kw, words", [
    (dict(retries=-1), "retries must be an integer from 0 to 100"), (dict(retries=True), "retries"),
    (dict(retries=1.5), "retries"), (dict(retries=101), "retries"), (dict(timeout=0), "timeout must be None"),
    (dict(timeout=-1), "timeout"), (dict(timeout=float("nan")), "timeout"), (dict(timeout=float("inf")), "timeout"),
    (dict(timeout="5"), "timeout"), (dict(timeout=True), "timeout"),
])
def test_retries_and_timeout_are_checked(client, kw, words):
    with pytest.raises(InvalidArgument, match=words):
        client.remote_parallel_map(functions.double, [1], spinner=False, **kw)
