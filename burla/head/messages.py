"""The messages the head makes of its records: a node's share of a job, a client's answer to
its opening or resumption, and the error of an input lost on too many nodes."""

from __future__ import annotations

from burla.errors import NodeDisconnected
from burla.head.scheduling.records import Assignment, JobRecord, initial_credit
from burla.protocol import wire
from burla.web import scoped_tokens

# What a client may have in flight to the head, per job.
CLIENT_WINDOW_INPUTS = 200_000
CLIENT_WINDOW_BYTES = 256 * 1024 * 1024
HEAD_STOPPED_WITHOUT_HISTORY = ("the head stopped (a restart or shutdown) while the job ran; a head keeps running jobs "
                                "across restarts only with history")


def assign_message(spec: wire.OpenJob, assignment: Assignment, cluster_token: str) -> wire.AssignJob:
    """A node's share of a job, with the job token its calls hold instead of the cluster token."""
    return wire.AssignJob(
        job_id=spec.job_id, function_name=spec.function_name, function_bytes=spec.function_bytes,
        parallelism=assignment.parallelism, func_ram=spec.func_ram, func_cpu=spec.func_cpu,
        local_code=spec.local_code, packages=spec.packages, credit=initial_credit(assignment.slots),
        func_gpu=spec.func_gpu, n_inputs=spec.n_inputs, job_token=scoped_tokens.job_token(cluster_token, spec.job_id),
        timeout=spec.timeout, direct_inputs=spec.direct_inputs, direct_results=spec.direct_results,
        reuse_key=spec.reuse_key,
    )


def accepted_message(job: JobRecord, cluster_token: str) -> wire.JobAccepted:
    """The answer to a job's opening, with the secret that resuming the job takes."""
    slots = sum(a.slots for a in job.assignments.values())
    return wire.JobAccepted(job_id=job.job_id, window_inputs=CLIENT_WINDOW_INPUTS, window_bytes=CLIENT_WINDOW_BYTES,
                            n_nodes=len(job.assignments), n_slots=slots, inputs_by_file=bool(job.spec.client_host),
                            job_secret=scoped_tokens.job_secret(cluster_token, job.job_id),
                            direct_inputs=job.spec.direct_inputs)


def resumed_message(job: JobRecord) -> wire.JobResumed:
    return wire.JobResumed(job_id=job.job_id, n_inputs=job.n_inputs, inputs_received=job.upload_prefix,
                           window_inputs=CLIENT_WINDOW_INPUTS, window_bytes=CLIENT_WINDOW_BYTES)


def node_loss_error(index: int, job: JobRecord) -> bytes:
    error = NodeDisconnected(
        f"input {index} was on {job.node_losses.get(index, 0)} nodes that died or went silent while "
        "running it; it is not retried again. If the call itself brings its machine down (memory, "
        "disk), give it more with func_ram or bigger machines."
    )
    return wire.describe_error(error)


def nodes_lost_reason(job: JobRecord, last: str) -> str:
    """Why a job ends when every node running it is gone and none can replace them."""
    return (f"Every node running this job was lost (last: {last}) and no node can replace it; "
            f"{job.n_inputs - job.n_done} of {job.n_inputs} inputs have no result.")
