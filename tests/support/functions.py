"""Functions the tests run remotely. Pickled by value (see conftest), like a user's __main__."""

from __future__ import annotations

import os
import sys
import threading
import time

LOCK = threading.Lock()


def double(x):
    return x * 2


def identity(*args, **kwargs):
    return args


def fail_on(x, bad=3):
    if x == bad:
        raise ValueError(f"input {x} is bad")
    return x


class CustomError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


def raise_custom(x):
    raise CustomError(x, "custom detail")


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("carries a lock")
        self.lock = threading.Lock()


def raise_unpicklable(x):
    raise Unpicklable()


def chatty(x):
    print(f"stdout line from {x}")
    print(f"stderr line from {x}", file=sys.stderr)
    os.write(1, f"fd write from {x}\n".encode())
    os.system(f"echo subprocess output from {x}")
    return x


def print_a_lot(megabytes):
    line = "x" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stdout.write(line)
    return megabytes


def exit_hard(x, crash_on=1):
    if x == crash_on:
        os._exit(13)
    return x


def segfault(x):
    if x == 0:
        import ctypes

        ctypes.string_at(0)
    return x


def record_interval(directory, index, seconds=0.2, gate=None):
    """Record when this call ran (to count how many ran at once). With a `gate` path, the call
    first says it started (`<index>.started`) and waits for that file to exist."""
    if gate is not None:
        open(os.path.join(directory, f"{index}.started"), "w").close()
        give_up = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < give_up:
            time.sleep(0.05)
    start = time.time()
    time.sleep(seconds)
    end = time.time()
    with open(os.path.join(directory, f"{index}.txt"), "w") as f:
        f.write(f"{start} {end} {os.getpid()}")
    return index


def record_meeting(directory, index, party, seconds=0.2, give_up_s=60.0):
    """record_interval once `party` calls have started (or after `give_up_s`): calls that can run
    at once all overlap, however slowly a loaded machine starts them; calls that can't, don't."""
    arrived = os.path.join(directory, "arrived")
    os.makedirs(arrived, exist_ok=True)
    open(os.path.join(arrived, str(index)), "w").close()
    give_up = time.monotonic() + give_up_s
    while len(os.listdir(arrived)) < party and time.monotonic() < give_up:
        time.sleep(0.02)
    return record_interval(directory, index, seconds)


def spin_interval(directory, index, seconds=1.0, wait_first=0.0):
    """Record when this call ran, having waited `wait_first` s and then kept a CPU busy for
    `seconds` of CPU time (to count how many CPU-bound calls ran at once)."""
    start = time.time()
    time.sleep(wait_first)
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass
    end = time.time()
    with open(os.path.join(directory, f"{index}.txt"), "w") as f:
        f.write(f"{start} {end} {os.getpid()}")
    return index


def count_runs(directory, index, seconds=1.0):
    """Append a line per run of this input (to count how often each input ran)."""
    with open(os.path.join(directory, f"{index}.runs"), "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return index


def max_overlap(directory) -> int:
    events = []
    for name in os.listdir(directory):
        if not name.endswith(".txt"):
            continue  # record_interval's `.started`, record_meeting's `arrived/`
        with open(os.path.join(directory, name)) as f:
            start, end, _pid = f.read().split()
        events.append((float(start), 1))
        events.append((float(end), -1))
    events.sort(key=lambda e: (e[0], e[1]))
    running = best = 0
    for _, delta in events:
        running += delta
        best = max(best, running)
    return best


def uses_lock(x):
    with LOCK:
        return x


def sleep_then_return(x, seconds=60):
    time.sleep(seconds)
    return x


def returns_lambda(x):
    return lambda: x


def pid(x):
    return os.getpid()


def kill_self(x, crash_on=0):
    if x == crash_on:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return x


def nested_sum(n):
    """A call that fans out a nested job on the same cluster and waits for it."""
    from burla import remote_parallel_map

    return sum(remote_parallel_map(double, range(n), spinner=False))


def nested_sleepers(x):
    from burla import remote_parallel_map

    return remote_parallel_map(sleep_then_return, [(i, 60) for i in range(2)], spinner=False)


def two_stage_pipeline(words):
    """A driver function: two nested stages, submitted as one job."""
    from burla import remote_parallel_map

    lengths = remote_parallel_map(len, words, spinner=False)
    return remote_parallel_map(double, lengths, spinner=False)


def hog(megabytes, hold_s=1.5):
    """Hold this much memory (touched, so it counts) for a moment."""
    data = b"x" * (megabytes * 2**20)
    time.sleep(hold_s)
    return len(data) // 2**20


def busy_threads(seconds):
    """A multithreaded call: twice as many busy threads (hashing releases the GIL) as cores."""
    import hashlib

    block = os.urandom(4 * 2**20)
    deadline = time.time() + seconds

    def spin():
        while time.time() < deadline:
            hashlib.sha256(block).digest()

    threads = [threading.Thread(target=spin) for _ in range(2 * (os.cpu_count() or 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return seconds


def where_burla_runs_from(x):
    """The file of the burla package the call runs with (a VM's own install, or the test's)."""
    import burla

    return burla.__file__


def pause_then_double(x, seconds=0.3):
    import time

    time.sleep(seconds)
    return x * 2


def pause_then_answer(x, seconds=0.003):
    """A call long enough that a worker reports after each (its flush interval is 2 ms): a plain
    value, a pickled one or a failure, by the input."""
    import time

    time.sleep(seconds)
    if x % 7 == 3:
        raise ValueError(f"input {x} fails")
    return [x] if x % 5 == 1 else x * 2


class _RunsCodeWhenLoaded:
    """A pickle that, when anyone loads it, appends that process's pid to a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"import os; open({self.marker!r}, 'a').write(str(os.getpid()) + chr(10))",))


def fail_with_a_planted_pickle(marker):
    """Job code that tampers with its own worker so that its failure payload is a pickle which
    runs code wherever it is loaded: what a malicious job (or a fake node) can send."""
    import pickle

    planted = lambda exc, skip_frames=0, origin=None: pickle.dumps(_RunsCodeWhenLoaded(marker))  # noqa: E731
    for module in (sys.modules["__main__"], sys.modules.get("burla.node.workers.worker")):  # the worker runs as -m
        if module is not None and hasattr(module, "pack_error"):
            module.pack_error = planted
    raise ValueError("planted")


def input_files_seen(data, hold_s=0.0):
    """How a call sees its input: its size, this node's input-file directory, and the files the
    job's client keeps there for this job right now (None: the client keeps none here)."""
    from burla.protocol.values.input_files import files_root

    time.sleep(hold_s)
    job_id = os.environ["BURLA_PARENT_JOB_ID"]
    root = files_root()
    dirs = [d for d in root.iterdir() if d.name.endswith("." + job_id)]
    return len(data), str(root), sorted(os.listdir(dirs[0])) if dirs else None


def break_error_handling(x):
    """Job code that breaks its worker's own error handling, then fails: the failure still has to
    reach the client (it hung the job, the worker dying and its input running again for ever)."""
    for module in (sys.modules["__main__"], sys.modules.get("burla.node.workers.worker")):
        if module is not None and hasattr(module, "pack_error"):
            module.pack_error = None  # calling it raises TypeError
    raise ValueError(f"input {x} failed")


def visible_gpu(seconds):
    """Which GPU this call's worker sees (CUDA_VISIBLE_DEVICES), after holding it a while."""
    time.sleep(seconds)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def credentials_seen(x):
    """What a call finds of the cluster's credentials: its environment, and the process's
    environment block as the kernel shows it (/proc/self/environ)."""
    with open("/proc/self/environ", "rb") as block:
        return {"environ": dict(os.environ), "block": block.read()}


def what_a_job_token_opens(other_job_id):
    """What a call can do with the token it holds (BURLA_JOB_TOKEN), beyond its own job: each
    attempt's HTTP status, or the kind of error the head answered on a WebSocket."""
    import asyncio

    import aiohttp

    from burla._version import __version__
    from burla.process.build import build_hash
    from burla.protocol import wire

    url, token = os.environ["BURLA_CLUSTER_DASHBOARD_URL"], os.environ["BURLA_JOB_TOKEN"]
    own = os.environ["BURLA_PARENT_JOB_ID"]
    python = "{}.{}.0".format(*sys.version_info[:2])

    def opening(job_id, parent):
        return wire.OpenJob(job_id=job_id, function_name="f", function_bytes=b"x", n_inputs=1, func_cpu=None,
                            func_ram=None, func_gpu=None, image=None, grow=False, max_parallelism=None, detach=False,
                            raise_errors=True, region=None, disk_gb=None, parent_job_id=parent, retries=0,
                            timeout=None,
                            client_version=__version__, python_version=python, local_code=b"", packages={})

    async def over_socket(session, path, frame):
        try:
            async with session.ws_connect(url + path) as ws:
                await ws.send_bytes(frame.encode())
                reply = await ws.receive()
                if reply.type != aiohttp.WSMsgType.BINARY:
                    return f"closed {reply.type}"
                answer = wire.decode(reply.data)
                return answer.kind if isinstance(answer, wire.ErrorReply) else type(answer).__name__
        except aiohttp.WSServerHandshakeError as e:
            return e.status

    async def attempts():
        outcome = {}
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            for name, method, path in [("own job", "GET", f"/v1/jobs/{own}"),
                                       ("other job", "GET", f"/v1/jobs/{other_job_id}"),
                                       ("job list", "GET", "/v1/jobs"), ("settings", "GET", "/v1/settings"),
                                       ("change settings", "POST", "/v1/settings"),
                                       ("stop the cluster", "POST", "/v1/cluster/stop"),
                                       ("cancel other job", "POST", f"/v1/jobs/{other_job_id}/cancel")]:
                async with session.request(method, url + path, json={}) as response:
                    outcome[name] = response.status
            outcome["attach to other job"] = await over_socket(
                session, "/v1/jobs/ws", wire.ResumeJob(other_job_id, 0, b"", ""))
            outcome["open a job outside its tree"] = await over_socket(
                session, "/v1/jobs/ws", opening(f"{own}-stray", None))
            outcome["open a child of another job"] = await over_socket(
                session, "/v1/jobs/ws", opening(f"{own}-adopted", other_job_id))
            outcome["register a node"] = await over_socket(
                session, "/v1/nodes/ws", wire.RegisterNode("rogue", "http://x", 1, 1, 1.0, None, 0, None, "local",
                                                           python, __version__, build_hash(), b"", []))
        return outcome

    return asyncio.run(attempts())


def memory_after(prefixes):
    """Every place this process's memory holds one of `prefixes`, with the 80 bytes that follow
    (read through /proc/self/mem): what a call could find of a secret it was never given. The
    caller passes prefixes only, so a whole secret found here was not brought in by the call."""
    found = {prefix: [] for prefix in prefixes}
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for region in regions:
            start, end = (int(part, 16) for part in region[0].split("-"))
            if "r" not in region[1] or (len(region) > 5 and region[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            for prefix in prefixes:
                needle = prefix.encode()
                at = data.find(needle)
                while at != -1:
                    found[prefix].append(data[at:at + len(needle) + 80])
                    at = data.find(needle, at + 1)
    return found


def fail_first_tries(directory, x, failures, slow_s=0.0):
    """Fails (or, with `slow_s`, sleeps that long) on its first `failures` tries for input `x`, then
    returns x: a flaky call. Its tries are counted in files under `directory`, which every worker shares."""
    import pathlib

    marks = pathlib.Path(directory)
    tries = len(list(marks.glob(f"{x}-*"))) + 1
    (marks / f"{x}-{tries}").touch()
    if tries <= failures:
        if slow_s:
            time.sleep(slow_s)
        else:
            raise ValueError(f"input {x} failed on try {tries}")
    return x


def reversed_with_digest(data, hold_s=0.0):
    """A result as large as the input: its bytes reversed, beside the input's digest."""
    import hashlib
    import time

    time.sleep(hold_s)
    return hashlib.sha256(data).hexdigest(), bytes(data[::-1])


def beyond_inline(x):
    """Results of every kind the inline path treats apart, from inline inputs: small values, an int
    past 64 bits, a lone surrogate, a long str, bytes (tests/protocol/test_inline_values.py)."""
    return [x, 2**64 + x, "\ud800" * (x % 3), "y" * (x + 200), bytes([x % 256]), x % 2 == 0, x / 7, None][x % 8]


def writes_its_index(x):
    """Writes its input, one of nine ways by x % 9 (Python with and without a newline, fd 1, C's
    write to fd 2, a child process, a thread, Python's stderr and binary stdout without a newline,
    sys.__stdout__), for per-call output attribution."""
    kind = x % 9
    if kind == 0:
        print(f"py {x}")
    elif kind == 1:
        print(f"partial {x}", end="")
    elif kind == 2:
        os.write(1, f"fd {x}\n".encode())
    elif kind == 3:
        import ctypes

        line = f"c {x}\n".encode()
        ctypes.CDLL(None).write(2, line, len(line))
    elif kind == 4:
        import subprocess

        subprocess.run(["echo", f"child {x}"], check=True)
    elif kind == 5:
        thread = threading.Thread(target=os.write, args=(1, f"thread {x}\n".encode()))
        thread.start()
        thread.join()
    elif kind == 6:
        sys.stderr.write(f"err {x}")
    elif kind == 7:
        sys.stdout.buffer.write(f"bin {x}".encode())
    else:
        print(f"dunder {x}", end="", file=sys.__stdout__)
    return x


def written_by(x) -> str:
    """What writes_its_index(x) writes."""
    return {0: f"py {x}\n", 1: f"partial {x}", 2: f"fd {x}\n", 3: f"c {x}\n", 4: f"child {x}\n",
            5: f"thread {x}\n", 6: f"err {x}", 7: f"bin {x}", 8: f"dunder {x}"}[x % 9]


def large_result(index, size):
    return bytes([index % 256]) * size


def digest_after(data, hold_s=0.0):
    """An input's size and SHA-256, after `hold_s` seconds."""
    import hashlib

    time.sleep(hold_s)
    return len(data), hashlib.sha256(data).hexdigest()


def sized_result(index, size, hold_s=0.0, fail_on=-1):
    """After `hold_s` seconds, `size` bytes that say their index (a small str for every fourth
    index), or an error for `fail_on`."""
    time.sleep(hold_s)
    if index == fail_on:
        raise ValueError(f"input {index} fails")
    if index % 4 == 3:
        return f"small-{index}"
    return index.to_bytes(4, "little") * (size // 4)


def plant_hook(directory):
    """A call that changes its worker process for every later call there (what a fresh process
    per tenant stops): each function the worker loads from then on is replaced by one that logs
    its job's inputs and job token and returns "TAMPERED". Returns the worker's pid."""
    from burla.node.workers import worker as worker_module

    log_path = os.path.join(directory, "hooked.log")
    original = worker_module.Worker._load

    def load(self, job_id, function_bytes, code):
        original(self, job_id, function_bytes, code)

        def tampered(*args):
            with open(log_path, "a") as log:
                log.write(f"{job_id} {args!r} {self._job_tokens.get(job_id)}\n")
            return "TAMPERED"

        self._functions[job_id] = tampered

    worker_module.Worker._load = load
    return os.getpid()


def doubled_with_pid(x):
    return x * 2, os.getpid()


def tagged_pid(x):
    return "tag", os.getpid()
