"""Every exception burla raises, in one tree.

    BurlaError
    ├── ClientInputError          the arguments given to remote_parallel_map can't be used
    │   ├── InvalidArgument       (also a ValueError) an argument has the wrong type or value
    │   ├── FunctionTooBig        the pickled function is over 100 MB
    │   ├── InputTooBig           one pickled input is over 200 MB (.input_index)
    │   ├── UnpicklableFunction   the function (or something it references) can't be pickled
    │   └── UnpicklableInput      one input can't be pickled (.input_index)
    ├── ClusterError              the cluster can't take the job
    │   ├── HeadUnreachable       no head answered at the configured URL
    │   ├── Unauthorized          the head or node refused the token (HTTP 401)
    │   ├── NoNodes               the cluster has no nodes and none are booting
    │   ├── NoCompatibleNodes     no node satisfies func_gpu / image / region / func_cpu / func_ram
    │   ├── VersionMismatch       client and head run incompatible burla versions
    │   ├── ProtocolError         a peer sent a message that does not decode (HTTP 400)
    │   ├── JobNotFound           the head has no such job, or no results left for it (HTTP 404)
    │   ├── DetachRequiresDeployedCluster
    │   ├── CloudSetupError       the cloud account can't be used as configured (names the fix)
    │   ├── TlsSetupError         the head's certificate or key can't be used
    │   ├── DeployError           a head can't be deployed or removed as asked
    │   ├── BuildUnavailable      the running burla can't be packed for VMs (no metadata)
    │   ├── BootstrapFailed       a VM could not be reached over SSH or set up as a node
    │   └── GrantRefused          a node was asked for inputs without the head's grant (HTTP 403)
    ├── JobError                  the job started but did not end normally
    │   ├── JobCanceled           `burla jobs cancel`, a parent that ended, or the head cancelled it
    │   │   ├── ClusterShutdown   the cluster was stopped under the job (`burla cluster stop`)
    │   │   └── ClusterRestarted  the cluster was restarted under the job (`burla cluster restart`)
    │   ├── JobFailed             the head ended the job (.reason names why)
    │   ├── NodeDisconnected      the connection to the cluster was lost mid-job
    │   ├── WorkerCrashed         the worker running a call died (.input_index, .exit_code)
    │   ├── CallExited            a call raised SystemExit (sys.exit) or KeyboardInterrupt: a failed call
    │   ├── CallTimeout           a call ran past the job's timeout (its worker was replaced)
    │   └── OutOfMemory           a call went past func_ram, or past its node's memory alone
    └── RemoteError               a call raised an exception that could not be re-created
                                  here; carries the type name, message and traceback text

A user function's own exception is re-raised with its original type, never wrapped; it
carries `burla_input_index` and the remote traceback. `RemoteError` only stands in when the
original exception object can't travel (unpicklable, or its class is missing here).
"""

from __future__ import annotations


class BurlaError(Exception):
    """Base of every exception raised by burla itself."""


class ClientInputError(BurlaError):
    pass


class InvalidArgument(ClientInputError, ValueError):
    pass


class FunctionTooBig(ClientInputError):
    pass


class SettingsError(InvalidArgument):
    """A cluster settings update that can't be applied; the message says what to fix."""


class InputTooBig(ClientInputError):
    def __init__(self, input_index: int, size: int, limit: int) -> None:
        self.input_index = self.burla_input_index = input_index
        self.size = size
        self.limit = limit
        super().__init__(
            f"Input {input_index} is {size / 2**20:.1f} MB pickled; the limit is {limit / 2**20:.0f} MB "
            "per input. Pass a path or URL and load the data inside the function instead."
        )

    def __reduce__(self):  # keep it picklable despite the custom __init__
        return (type(self), (self.input_index, self.size, self.limit))


class UnpicklableFunction(ClientInputError):
    pass


class UnpicklableInput(ClientInputError):
    def __init__(self, input_index: int, detail: str) -> None:
        self.input_index = self.burla_input_index = input_index
        self.detail = detail
        super().__init__(
            f"Input {input_index} can't be pickled: {detail}. Pass plain data (numbers, "
            "strings, paths, dicts) and create handles such as locks, sockets or open files "
            "inside the function."
        )

    def __reduce__(self):
        return (type(self), (self.input_index, self.detail))


class ClusterError(BurlaError):
    pass


class HeadUnreachable(ClusterError):
    pass


class Unauthorized(ClusterError):
    pass


class HeadNotVerified(Unauthorized):
    """What answers at a head's address could not prove it holds the cluster token: nothing
    secret was sent to it."""


class NoNodes(ClusterError):
    pass


class NoCompatibleNodes(ClusterError):
    pass


class VersionMismatch(ClusterError):
    pass


class ProtocolError(ClusterError):
    pass


class JobNotFound(ClusterError):
    pass


class Overloaded(ClusterError):
    """The head is at one of its limits (jobs running at once, connections per credential)."""


class BudgetExceeded(Overloaded):
    """A job tree (a job and the jobs its calls open) is at its own limit on open jobs or bytes."""


class DetachRequiresDeployedCluster(ClusterError):
    pass


class CloudSetupError(ClusterError):
    """The cloud account can't be used as configured; the message names the command that fixes it."""


class CloudRefused(ClusterError):
    """The cloud refused a request (a quota, a shortage of capacity, a setting it does not take):
    the message is the cloud's own, prefixed with what was asked. `booted` lists the machines of
    the same request that the cloud did start (they are billed, so the head keeps track of them)."""

    QUOTA = "quota"  # the account's limit: a smaller machine, or another region, may still start
    CAPACITY = "capacity"  # the zone has none of this machine right now: another zone or size may

    def __init__(self, message: str, booted: list[str] | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.booted = booted or []
        self.kind = kind  # QUOTA, CAPACITY, or None for any other refusal


class TlsSetupError(ClusterError):
    """The head's certificate or key can't be used; the message says what to fix."""


class DeployError(ClusterError):
    """A head can't be deployed (or removed) as asked; the message says what to do."""


class BuildUnavailable(ClusterError):
    pass


class BootstrapFailed(ClusterError):
    pass


class GrantRefused(ClusterError):
    """A node was asked for a transfer without the head's valid grant for it."""


class JobError(BurlaError):
    pass


class JobCanceled(JobError):
    pass


class ClusterShutdown(JobCanceled):
    """The cluster was stopped while the job ran (its running calls were stopped too)."""


class ClusterRestarted(JobCanceled):
    """The cluster was restarted while the job ran: run the job again on the restarted cluster."""


class JobFailed(JobError):
    pass


class CallFailed(JobError):
    """A call raised and the job stopped there (raise_errors). Clients raise the call's own
    exception instead; this names why the job ended, in its history and on the wire."""


class NodeDisconnected(JobError):
    pass


class CallExited(JobError):
    """A call raised SystemExit (`sys.exit(2)`, `exit()`) or KeyboardInterrupt. In the call's own
    process that ends the program; in a call it is that call's failure (with `burla_input_index`),
    never the client's exit."""


class CallTimeout(JobError):
    """A call ran past `remote_parallel_map(..., timeout=SECONDS)`: its worker was stopped and
    replaced, and the call failed (it ran again first if `retries` remained)."""

    def __init__(self, input_index: int, timeout_s: float) -> None:
        self.input_index = self.burla_input_index = input_index
        self.timeout_s = timeout_s
        super().__init__(f"The call of input {input_index} ran past its timeout of {timeout_s:g} s and was stopped "
                         "(its worker was replaced). Raise timeout=, or make the call faster.")

    def __reduce__(self):
        return (type(self), (self.input_index, self.timeout_s))


class WorkerCrashed(JobError):
    def __init__(self, input_index: int, exit_code: int | None, attempts: int) -> None:
        self.input_index = self.burla_input_index = input_index
        self.exit_code = exit_code
        self.attempts = attempts
        how = _describe_exit(exit_code)
        super().__init__(
            f"The worker running input {input_index} died ({how}) on each of {attempts} "
            "attempt(s). The call crashed its process (os._exit, a segfault in native code, "
            "or the process was killed, often for memory); try it locally to see why."
        )

    def __reduce__(self):
        return (type(self), (self.input_index, self.exit_code, self.attempts))


class OutOfMemory(JobError):
    def __init__(self, input_index: int, used_gb: float, limit_gb: float, per_call: bool) -> None:
        self.input_index = self.burla_input_index = input_index
        self.used_gb = used_gb
        self.limit_gb = limit_gb
        self.per_call = per_call
        if per_call:
            how = f"past its func_ram={limit_gb:g} GB"
            fix = "raise func_ram, or make the call use less memory"
        else:
            how = f"past the {limit_gb:.1f} GB this node has for calls, running alone"
            fix = "use bigger machines, or make the call use less memory"
        super().__init__(f"Input {input_index} used {used_gb:.2f} GB {how}; its worker was stopped. To fix: {fix}.")

    def __reduce__(self):
        return (type(self), (self.input_index, self.used_gb, self.limit_gb, self.per_call))


class RemoteError(BurlaError):
    """A remote exception whose original object could not be re-created on the client."""

    def __init__(self, type_name: str, message: str, traceback_text: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self):
        return (type(self), (self.type_name, self.message, self.traceback_text))


def _describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "exit status unknown"
    if exit_code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


# Error kinds that travel on the wire (JobRejected / ErrorReply) and map back to classes here.
WIRE_ERRORS: dict[str, type[BurlaError]] = {
    cls.__name__: cls
    for cls in (
        Overloaded,
        BudgetExceeded,
        InvalidArgument,
        FunctionTooBig,
        UnpicklableFunction,
        HeadUnreachable,
        Unauthorized,
        NoNodes,
        NoCompatibleNodes,
        VersionMismatch,
        ProtocolError,
        JobNotFound,
        DetachRequiresDeployedCluster,
        JobCanceled,
        ClusterShutdown,
        ClusterRestarted,
        JobFailed,
        CallFailed,
        NodeDisconnected,
    )
}


def error_from_wire(kind: str, message: str) -> BurlaError:
    """Build the exception a peer described by class name and message."""
    return WIRE_ERRORS.get(kind, BurlaError)(message)
