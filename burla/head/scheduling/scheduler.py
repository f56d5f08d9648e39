"""The head's live truth about nodes and jobs, as pure state: no I/O, no clocks, no asyncio.

The `Cluster` (head/cluster.py) feeds it events (a node registered, credit arrived, results
came back, a node was lost) and carries out what it returns (which inputs go to which node).
Keeping it pure makes every scheduling rule testable in microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter

from burla.errors import NoCompatibleNodes, NoNodes, ProtocolError
from burla.head.scheduling.eligibility import (
    Given,
    can_join,
    explain,
    ineligibility,
    no_nodes_message,
    node_parallelism,
    placement_order,
    share,
)
from burla.head.scheduling.pushes import least_push
from burla.head.scheduling.records import RUNNING, Assignment, JobRecord, NodeRecord, mark_fresh
from burla.head.scheduling.retries import retry
from burla.protocol import limits, wire
from burla.protocol.states import EndKind, JobStatus, NodeStatus
from burla.protocol.values.packed_inputs import PackedInputs, gather, pack_uints, run_first, unpack_uints
from burla.protocol.views import USAGE_FIELDS

# What a node's state push reports of its usage, copied by name (status is parsed).
_REPORTED_USAGE = tuple(name for name in USAGE_FIELDS if name != "status")
MAX_NODE_LOSSES = 3  # an input whose node died this many times ends in NodeDisconnected

_index_of = itemgetter(0)
_ok_of = itemgetter(1)


class Scheduler:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        # The jobs still RUNNING (the head keeps up to 1,000 ended ones in `jobs`): every per-event
        # pass goes over these only.
        self.running: dict[str, JobRecord] = {}
        self.cloud: str | None = None  # the cloud this head boots VMs on (its fleet says), for messages
        self.booting_ids: set[str] = set()  # nodes a driver is starting that have not registered yet
        self.booting_hosts: dict[str, str] = {}  # booting node id -> its host id, where known ahead
        self._withdrawn: list[tuple[str, str, int]] = []  # credit kept back by the last plans (take_withdrawn)
        self._all_pushed: list[JobRecord] = []  # jobs the last plans pushed the last inputs of (take_all_pushed)

    @property
    def booting(self) -> int:
        return len(self.booting_ids)

    # --- nodes ---------------------------------------------------------------------------

    def add_node(self, node: NodeRecord, holding: set[str] | frozenset[str] = frozenset()
                 ) -> list[tuple[JobRecord, int]]:
        """Register a node; returns the running jobs it should join, with their parallelism.

        `holding`: jobs whose inputs the node kept running while it had no head. It joins those
        even where the others' shares already add up to the job's cap: otherwise what it holds
        would be cancelled there and run again elsewhere."""
        self.nodes[node.node_id] = node
        joins = []
        for job in self.running.values():
            if not can_join(node, job.spec):
                continue
            parallelism, slots = share(node, node_parallelism(node, job.spec), job, Given(job), job.job_id in holding)
            if parallelism > 0:
                job.assignments[node.node_id] = Assignment.first(job.holders, parallelism, slots)
                joins.append((job, parallelism))
        return joins

    def top_up(self, job: JobRecord) -> list[tuple[str, int]]:
        """After a node of a running job was lost: give the job to other nodes that can run it, up
        to the slots it wants (a job capped by its inputs or max_parallelism may have left them
        out). Returns the nodes that joined, with their parallelism, to send AssignJob."""
        if job.status != RUNNING:
            return []
        joined = []
        given = Given(job)
        for node in self.nodes.values():
            if node.node_id in job.assignments or not can_join(node, job.spec):
                continue
            parallelism, slots = share(node, node_parallelism(node, job.spec), job, given)
            if parallelism > 0:
                job.assignments[node.node_id] = Assignment.first(job.holders, parallelism, slots)
                given.add(parallelism, slots)
                joined.append((node.node_id, parallelism))
        return joined

    def remove_node(self, node_id: str) -> list[tuple[JobRecord, list[int]]]:
        """Forget a node and put every input it held back at the front of its job's queue.

        Returns the affected jobs, each with the inputs that have now been on too many lost
        nodes (MAX_NODE_LOSSES): those end in an error instead of running again.
        """
        self.nodes.pop(node_id, None)
        affected = []
        for job in self.running.values():
            assignment = job.assignments.pop(node_id, None)
            if assignment is None:
                continue
            given_up = []
            if job.node_held:  # the client's upload of these now goes to the queue
                for index in [i for i, holder in job.node_held.items() if holder == node_id]:
                    del job.node_held[index]
            held = assignment.inflight.close()
            if job.status == RUNNING:
                back = []
                for index, run in held.items():
                    if job.done[index]:
                        continue
                    losses = job.node_losses.get(index, 0) + 1
                    job.node_losses[index] = losses
                    if losses >= MAX_NODE_LOSSES:
                        given_up.append(index)
                    else:
                        back.append((index, run))
                if back:
                    job.pending.prepend(gather(back))
                job.lost_holdings[node_id] = {index for index, _ in back}
            affected.append((job, given_up))
        return affected

    def update_state(self, msg: wire.NodeState) -> None:
        node = self.nodes.get(msg.node_id)
        if node is None:
            return
        node.status = NodeStatus(msg.status)  # checked when the frame was decoded
        for name in _REPORTED_USAGE:
            setattr(node, name, getattr(msg, name))
        node.running_by_job = {job_id: running for job_id, running, _queued, _done in msg.jobs}
        node.queued_by_job = {job_id: queued for job_id, _running, queued, _done in msg.jobs}

    # --- admission -----------------------------------------------------------------------

    def admit(self, spec: wire.OpenJob) -> JobRecord:
        """Create the job and its node assignments, or raise why no node can take it."""
        if spec.job_id in self.jobs:
            raise ProtocolError(f"job id {spec.job_id!r} is already in use")
        if not self.nodes and self.booting == 0:
            raise NoNodes(no_nodes_message(spec, self.cloud))
        reasons: dict[str, list[NodeRecord]] = {}
        eligible: list[tuple[NodeRecord, int]] = []
        for node in self.nodes.values():
            reason = ineligibility(node, spec)
            if reason is None:
                eligible.append((node, node_parallelism(node, spec)))
            else:
                reasons.setdefault(reason, []).append(node)
        if not eligible and self.booting == 0:
            raise NoCompatibleNodes(explain(spec, reasons, len(self.nodes), self.cloud))
        # Inputs by file only when every node that could run the job shares the client's machine
        # (and none is booting elsewhere); the job then stays on that machine's nodes.
        if spec.client_host and not self._all_on(spec.client_host, [node for node, _ in eligible]):
            spec = spec.replace(client_host="")
        # Large inputs straight to their nodes, unless they go by file, or the client leaves (a
        # detached job's inputs must be kept on the head).
        if spec.direct_inputs and (spec.client_host or spec.detach):
            spec = spec.replace(direct_inputs=False)
        if spec.direct_results and spec.detach:  # and large results (the head keeps a detached job's)
            spec = spec.replace(direct_results=False)
        return self._create(spec, eligible)

    def _all_on(self, host_id: str, eligible: list[NodeRecord]) -> bool:
        """Whether every node that could run a job, ready or booting, is on this host."""
        if not eligible and not self.booting_ids:
            return False
        for node_id in list(self.booting_hosts):  # registered or failed since
            if node_id not in self.booting_ids:
                del self.booting_hosts[node_id]
        return (all(node.host_id == host_id for node in eligible)
                and all(self.booting_hosts.get(node_id) == host_id for node_id in self.booting_ids))

    def restore(self, spec: wire.OpenJob) -> JobRecord:
        """Take up a job that was running when the head restarted: it waits for nodes, which
        join it as they register, and for its client, which says which results it already has."""
        if spec.job_id in self.jobs:
            raise ProtocolError(f"job id {spec.job_id!r} is already in use")
        eligible = [(node, node_parallelism(node, spec)) for node in self.nodes.values()
                    if can_join(node, spec)]
        job = self._create(spec, eligible)
        job.restored = job.taken_up = True
        return job

    def _create(self, spec: wire.OpenJob, eligible: list[tuple[NodeRecord, int]]) -> JobRecord:
        job = JobRecord(spec)  # per-input flags grow as inputs come (JobRecord.cover)
        ordered = placement_order(eligible, self.running.values())
        # First a call per slot on as many nodes as the caps allow, then what max_parallelism
        # leaves of their parallelism (calls that wait may run more than one per slot).
        given = Given(job)
        for node, ceiling in ordered:
            parallelism, slots = share(node, min(ceiling, node.slots), job, given)
            if parallelism > 0:
                job.assignments[node.node_id] = Assignment.first(job.holders, parallelism, slots)
                given.add(parallelism, slots)
        for node, ceiling in ordered:
            assignment = job.assignments.get(node.node_id)
            if assignment is not None:
                room = spec.max_parallelism - given.parallelism if spec.max_parallelism is not None else math.inf
                more = int(min(min(ceiling, spec.n_inputs) - assignment.parallelism, room))
                assignment.parallelism += more
                given.add(more, 0)
        self.jobs[spec.job_id] = job
        self.running[spec.job_id] = job
        return job

    def unrunnable(self) -> list[tuple[JobRecord, EndKind, str]]:
        """Running jobs no node can run, now that none is booting: [(job, end kind, why)].

        A job that holds nodes, or waits for nodes expected back after a restart, is not one.
        Called whenever nodes register, leave or give up booting, so no job waits forever for a
        node that will never come (one admitted while its only candidate was still booting)."""
        if self.booting:
            return []
        found = []
        for job in self.running.values():
            if job.assignments or job.waits_for_nodes or job.restored:
                continue
            if not self.nodes:
                found.append((job, EndKind.NO_NODES, "No node is left in the cluster to run this job. Start nodes "
                              "(`burla cluster start`, `burla node join --head URL`) and run it again."))
                continue
            reasons: dict[str, list[NodeRecord]] = {}
            for node in self.nodes.values():
                reason = ineligibility(node, job.spec) or ("host" if not can_join(node, job.spec) else None)
                if reason is None:
                    break  # a node could take it after all: leave it be
                reasons.setdefault(reason, []).append(node)
            else:
                why = explain(job.spec, reasons, len(self.nodes), self.cloud)
                found.append((job, EndKind.NO_COMPATIBLE_NODES, why))
        return found

    # --- inputs and results --------------------------------------------------------------

    def add_inputs(self, job: JobRecord, items: list) -> None:
        """Queue these inputs, [[input_index, pickled_args], ...]."""
        if items:
            self.add_packed(job, PackedInputs.of(items))

    def add_packed(self, job: JobRecord, part: PackedInputs) -> None:
        """Queue a run of inputs as it came (checked: `PackedInputs.check`); the queue keeps it."""
        if job.status != RUNNING:
            return  # uploads still on their way when the job ended
        if job.node_held or job.lenient_uploads:
            part = self._not_held(job, part)
        count = part.count
        if not count:
            return
        first = run_first(part.indices)  # -1 if not a run
        end = first + count
        seen = job.seen
        prefix = job.upload_prefix
        if 0 <= first and end <= job.n_inputs:
            job.cover(end)
        if 0 <= first and end <= len(seen) and seen.find(1, first, end) < 0:
            seen[first:end] = b"\x01" * count  # the common case, a new run of inputs: at C speed
            if prefix == first:
                prefix = end
        else:
            self._mark_uploaded(job, unpack_uints(part.indices))
        job.received += count
        job.pending.append(part)
        missing = seen.find(0, prefix)  # the first input not uploaded yet, found at C speed
        job.upload_prefix = len(seen) if missing < 0 else missing

    def _not_held(self, job: JobRecord, part: PackedInputs) -> PackedInputs:
        """Of an upload to a job taken up after a restart, what is to be queued: inputs a node
        holds already become its in-flight inputs, and those uploaded before are ignored."""
        items = part.items()
        if job.node_held:
            items = self._to_holders(job, items)
        if job.lenient_uploads:  # taken up from history: its client may send again what was kept
            # ... or what a node's result finished since the client said what it holds (a returning
            # node's results may come in between): neither is queued again.
            seen, done = job.seen, job.done  # (as long as each other: `cover` grows them together)
            items = [item for item in items if not (0 <= item[0] < len(seen) and (seen[item[0]] or done[item[0]]))]
        return PackedInputs.of(items) if items else PackedInputs(b"", b"", b"")

    @staticmethod
    def _mark_uploaded(job: JobRecord, indices: Sequence[int]) -> None:
        """Mark each input uploaded; one outside the job or uploaded before is the client's error."""
        n, seen = job.n_inputs, job.seen
        outside = next((index for index in indices if not 0 <= index < n), None)
        if outside is not None:
            raise ProtocolError(f"input index {outside} is outside 0..{n - 1}")
        job.cover(max(indices) + 1)
        for index in indices:
            if seen[index]:
                raise ProtocolError(f"input index {index} was uploaded twice")
            seen[index] = 1

    @staticmethod
    def _to_holders(job: JobRecord, items: list) -> list:
        """Inputs a node already holds become its in-flight inputs; returns the others."""
        rest = []
        held = job.node_held
        for item in items:
            holder = held.pop(item[0], None) if type(item[0]) is int else None
            assignment = job.assignments.get(holder) if holder is not None else None
            if assignment is None or (item[0] < len(job.seen) and job.seen[item[0]]):
                rest.append(item)
                continue
            job.cover(item[0] + 1)
            assignment.inflight.add(item[0], PackedInputs.of_lists([item[0]], [item[1]]))
            job.seen[item[0]] = 1
            job.received += 1
        return rest

    def grant(self, node_id: str, job_id: str, inputs: int) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        assignment = job.assignments.get(node_id)
        if assignment is not None:  # never more than the node could hold: a node asks for its window
            assignment.credit = min(assignment.credit + inputs, max(limits.MAX_NODE_WINDOW, 2 * assignment.parallelism))

    def plan(self) -> list[tuple[str, str, PackedInputs]]:
        """Move pending inputs onto nodes within their credit: [(node_id, job_id, packed inputs)].

        Pending inputs are spread over the nodes with credit, but each push is at least
        `_least_push` if the node's credit allows: thinner pushes cost a frame per node per
        upload batch and keep no more workers busy. A plan never keeps credit back beside waiting
        inputs (see below), so it withdraws none: only `plan_for` does.
        """
        pushes: list[tuple[str, str, PackedInputs]] = []
        for job in self.running.values():
            if not job.pending or job.waits_for_nodes:
                continue
            # Smallest credit first, so what a nearly full node can't take goes to the others.
            takers = sorted(
                ((node_id, a) for node_id, a in job.assignments.items() if a.credit > 0), key=lambda t: t[1].credit
            )
            # A node that can't take its share is followed only by nodes with more credit, which take
            # what it left: afterwards either nothing waits or every taker's credit is spent, so no
            # credit sits here beside waiting inputs and none is withdrawn to be asked for again.
            for position, (node_id, assignment) in enumerate(takers):
                if not job.pending:
                    break
                fair_share = math.ceil(len(job.pending) / (len(takers) - position))
                self._push(job, node_id, assignment, max(fair_share, least_push(assignment)), pushes,
                           withdraw=False)
        return pushes

    def plan_for(self, node_id: str, job_id: str) -> list[tuple[str, str, PackedInputs]]:
        """After credit from one node, fill that node alone: its share of what is pending, at
        least `_least_push` (the same rule as `plan`, without going over every node); and, within
        its credit, all of it if that is at most limits.BATCH_ITEMS inputs and what would stay for
        the others is less than that least push: kept back, it would mostly cost this node a
        withdrawal and a credit message to take it a moment later."""
        job = self.jobs.get(job_id)
        if job is None or job.status != RUNNING or not job.pending or job.waits_for_nodes:
            return []
        assignment = job.assignments.get(node_id)
        if assignment is None or assignment.credit <= 0:
            return []
        pushes: list[tuple[str, str, PackedInputs]] = []
        least = least_push(assignment)
        wanted = max(math.ceil(len(job.pending) / len(job.assignments)), least)
        if len(job.pending) - wanted < least and len(job.pending) <= limits.BATCH_ITEMS:
            wanted = len(job.pending)
        self._push(job, node_id, assignment, wanted, pushes)
        return pushes

    def take_withdrawn(self) -> list[tuple[str, str, int]]:
        """Credit the last plans kept back from nodes: [(node_id, job_id, inputs)], to tell them."""
        withdrawn, self._withdrawn = self._withdrawn, []
        return withdrawn

    def take_all_pushed(self) -> list[JobRecord]:
        """Jobs whose last inputs the last plans pushed, to tell their nodes (once a job)."""
        jobs, self._all_pushed = self._all_pushed, []
        return jobs

    def _push(self, job: JobRecord, node_id: str, assignment: Assignment, wanted: int, pushes: list,
              withdraw: bool = True) -> None:
        count = min(assignment.credit, wanted, len(job.pending))
        inflight = assignment.inflight
        for frame in job.pending.take(count):
            inflight.add_run(frame)
            pushes.append((node_id, job.job_id, frame))
        assignment.credit -= count
        if not job.pending and job.received >= job.n_inputs and not job.all_pushed:
            job.all_pushed = True
            self._all_pushed.append(job)
        if withdraw and job.pending and assignment.credit > 0:
            # Held back so the other nodes get their share: no credit may sit here while inputs wait
            # (the node would not ask again, counting on it, and nothing else would push them).
            self._withdrawn.append((node_id, job.job_id, assignment.credit))
            assignment.credit = 0

    def record_results(self, node_id: str | None, job: JobRecord, items: list) -> list:
        """Keep the first result per index (results are delivered exactly once), of inputs the
        node holds (pushed to it, granted to it by a steal, or kept by it across a restart);
        `node_id` None: the head's own word (an input given up on)."""
        if job.status != RUNNING:
            return []  # late results of an ended job
        assignment = job.assignments.get(node_id) if node_id is not None else None
        if node_id is not None and assignment is None:
            return []  # not a node of this job
        if self._plain(job, assignment, items):
            fresh = self._all_fresh(job, assignment, items)  # type: ignore[arg-type]
            if fresh is not None:
                return fresh
        return [item for item in items if self._take(job, assignment, node_id, item)]

    def _take(self, job: JobRecord, assignment: Assignment | None, node_id: str | None, item: list) -> bool:
        """Record one result if it is the first for its input and this node's to give; a failure
        with retries left queues the input again instead. True if recorded."""
        index, ok = item[0], item[1]
        if not self._awaits_result(job, index):
            return False
        if assignment is not None and index not in assignment.inflight and job.node_held.get(index) != node_id:
            return False  # not this node's input: the node that holds it answers
        if not ok and assignment is not None and retry(job, assignment, index):
            return False
        job.holders.set(index, 0)  # in flight nowhere now
        if job.node_held:
            job.node_held.pop(index, None)
        job.done[index] = 1
        job.n_done += 1
        if not ok:
            job.n_failed += 1
            if job.restored:
                job.failed_here.add(index)
        return True

    @staticmethod
    def _plain(job: JobRecord, assignment: Assignment | None, items: list) -> bool:
        """Whether results may take the fast path: a node's own, of a job not taken up after a
        restart, with no failure to run again."""
        return (assignment is not None and not job.node_held and not job.restored and bool(items)
                and (not job.spec.retries or all(map(_ok_of, items))))

    @staticmethod
    def _awaits_result(job: JobRecord, index: int) -> bool:
        """Whether input `index` is one whose result is still to come: uploaded (or held by a node
        from before a restart) and not done."""
        if not 0 <= index < job.n_inputs:
            return False
        if index >= len(job.done):  # never uploaded: only a node holding it from before a restart has it
            if index not in job.node_held:
                return False
            job.cover(index + 1)
        return not job.done[index]

    def record_successes(self, node_id: str, job: JobRecord, indices: bytes, runs: bytes = b"") -> bool:
        """record_results' common case, for results known to have all succeeded, by their packed
        indices (in the parts `runs` counts: PackedResults.runs): True (and recorded) when every
        one is the first for its input, as the node's own results of a running job; False
        (nothing changed) when record_results must sort them out."""
        assignment = job.assignments.get(node_id)
        if job.status != RUNNING or assignment is None or job.node_held or job.restored or not indices:
            return False
        return mark_fresh(job, assignment, indices, runs)

    @classmethod
    def _all_fresh(cls, job: JobRecord, assignment: Assignment, items: list) -> list | None:
        """The common case at C speed where it can be: every result is the first for its input (none
        is a repeat, in this batch or before). Returns the items, or None (nothing changed) if not."""
        if not mark_fresh(job, assignment, pack_uints(list(map(_index_of, items)))):
            return None
        job.n_failed += list(map(_ok_of, items)).count(False)  # ok-codes: True, False, VALUE (2)
        return items

    def finish(self, job: JobRecord, status: JobStatus, reason: str = "") -> list[str]:
        """End a job; returns the nodes that should release it."""
        if job.status == RUNNING:
            job.status = status
            job.reason = reason
        self.running.pop(job.job_id, None)
        job.pending.clear()
        nodes = list(job.assignments)
        job.holders.clear()
        for assignment in job.assignments.values():
            assignment.credit = 0
        # An ended job keeps only its counts and arguments (the head keeps the last 1,000): its
        # per-input state and the function's bytes would otherwise stay for each of them.
        job.seen = bytearray()
        job.done = bytearray()
        job.node_losses.clear()
        job.node_held.clear()
        job.failed_here.clear()
        job.spec = job.spec.replace(function_bytes=b"", local_code=b"", packages={})
        return nodes

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.running.pop(job_id, None)

