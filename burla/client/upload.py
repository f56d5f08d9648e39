"""The client's upload side of one job: encode inputs and send them within the head's window.

The window counts the inputs that are out (sent, their result not yet back) and what they
weigh; it frees as results return. A large input goes by file, or as a placeholder whose bytes
go straight to its node (burla.client.direct_sender), when the head allows it.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from burla.client.progress import Display
from burla.client.results import index_runs
from burla.config import MAX_INPUT_BYTES
from burla.errors import InputTooBig, UnpicklableInput
from burla.protocol import direct_inputs, limits, wire
from burla.protocol.values import inline_values
from burla.protocol.values.input_files import INPUT_FILE_MIN_BYTES, InputFiles
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.pickle_parts import PickleParts
from burla.protocol.values.serialization import dumps_input

UPLOAD_BATCH_BYTES = 1024 * 1024
UPLOAD_BATCH_ITEMS = limits.BATCH_ITEMS
FIRST_UPLOAD_BATCH_ITEMS = 256  # the upload loop's first batch after the opening; each next one doubles
FIRST_BATCH_ITEMS = 256  # inputs sent with the opening, before the head's answer (well inside any window)
FIRST_BATCH_BYTES = 256 * 1024
_RUN_MIN_ITEMS = 16  # a run of small plain inputs shorter than this is taken one by one
KEPT_CONFIRM_S = 60.0  # a detaching client waits this long for the head to say its inputs are saved


Send = Callable[[wire.Message], Awaitable[None]]


class _Batch:
    """The inputs of the next InputBatch: their indices, sizes and bytes as PackedInputs carries
    them, a run of small plain inputs as one segment."""

    __slots__ = ("indices", "sizes", "segments", "bytes")

    def __init__(self) -> None:
        self.indices = array("I")
        self.sizes = array("I")
        self.segments: list[bytes | PickleParts] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.indices)

    def add(self, index: int, data: bytes | PickleParts) -> None:
        self.indices.append(index)
        self.sizes.append(len(data))
        self.segments.append(data)
        self.bytes += len(data)

    def add_run(self, start: int, data: bytes, sizes: array) -> None:
        self.indices.extend(range(start, start + len(sizes)))
        self.sizes.extend(sizes)
        self.segments.append(data)
        self.bytes += len(data)

    def message(self, job_id: str) -> wire.InputBatch:
        return wire.InputBatch.of(job_id, PackedInputs.of_segments(self.indices.tobytes(), self.sizes.tobytes(),
                                                                   self.segments))


def _no_sizes(n_inputs: int) -> array:
    return array("I", bytes(4 * n_inputs))  # an input is at most MAX_INPUT_BYTES < 2**32


class Uploader:
    """Sends one job's inputs. `received[index]` (shared with the receiving side) is nonzero once
    that input's result is in: such an input is never sent again after a reconnect."""

    def __init__(self, job_id: str, inputs: Sequence[Any], received: bytearray, display: Display,
                 detaching: bool) -> None:
        self.job_id = job_id
        self.inputs = inputs
        self.received = received
        self.display = display
        # A detaching client only uploads: the head keeps every result for get_results, so the
        # window does not hold it back.
        self.detaching = detaching
        self.window_inputs = 1
        self.window_bytes = 0
        self.outstanding_inputs = 0
        self.outstanding_bytes = 0
        # Per input, its size while it is out (0: not out). An array, not a dict: a million-input
        # job would otherwise spend ~20 MB on it.
        self.sizes = _no_sizes(len(received))
        self.sent_until = 0  # every input sent so far has a lower index
        self.window_open = asyncio.Event()
        self.kept = asyncio.Event()  # detaching: the head says every input is saved (InputsKept)
        self.files: InputFiles | None = None  # where large inputs go when the head allows it
        self.files_full = False  # a file could not be written: the rest go inline
        # Large inputs sent as placeholders (direct_inputs), each kept until its result is in: the
        # head may name their node again (a node lost, a connection cut).
        self.direct = False
        self.direct_pending: dict[int, bytes | PickleParts] = {}
        self._pickled_ahead: tuple[int, bytes | PickleParts] | None = None  # first_batch's one that did not fit

    # --- the window ----------------------------------------------------------------------

    def resume(self, start: int, window: tuple[int, int]) -> None:
        """A (re)opened connection: the head's window, and inputs sent from `start` on that never
        reached the head (a cut) leave the window, to go again."""
        self.window_inputs, self.window_bytes = window
        for index in range(start, self.sent_until):
            self.leave_window(index)

    def leave_window(self, index: int) -> None:
        size = self.sizes[index]
        if size:
            self.sizes[index] = 0
            self.outstanding_inputs -= 1
            self.outstanding_bytes -= size

    def results_in(self, indices: Sequence[int]) -> None:
        """These inputs have their results: they leave the window (and their files go)."""
        sizes = self.sizes
        freed_inputs = freed_bytes = 0
        spans = index_runs(indices) if indices else None
        if spans is not None:
            # Runs of inputs (a worker's report each): at C speed. An input in two runs (a result
            # the head sent again) is freed once: the first run left its size at 0.
            for _, first, length in spans:
                end = first + length
                run = sizes[first:end]
                freed_inputs += len(run) - run.count(0)
                freed_bytes += sum(run)
                sizes[first:end] = _no_sizes(len(run))
        else:
            for index in indices:
                size = sizes[index]
                if size:
                    sizes[index] = 0
                    freed_inputs += 1
                    freed_bytes += size
        self.outstanding_inputs -= freed_inputs
        self.outstanding_bytes -= freed_bytes
        pending = self.direct_pending
        if pending:
            for index in indices:
                pending.pop(index, None)
        files = self.files
        if files is not None and files.written:
            for index in indices:
                files.done(index)
        self.window_open.set()

    # --- large inputs by file ------------------------------------------------------------

    def use_files(self, root: Path) -> None:
        """Every node of the job shares this machine: large inputs go as files under `root`."""
        self.files = InputFiles(root, self.job_id)  # its directory comes with the first file

    def close_files(self) -> None:
        if self.files is not None:
            self.files.close()

    def _by_file(self, index: int, data: bytes | PickleParts) -> bytes | PickleParts:
        """The reference to send for a large input, or its bytes if its file can't be written
        (the directory is full, say): then it, and the rest of the job, go inline."""
        assert self.files is not None
        try:
            return self.files.write(index, data)
        except OSError as e:
            self.display.announce(f"large inputs go inline from input {index} on: can't write its file ({e})")
            self.files_full = True  # those written so far stay until their results are back
            return data

    # --- encoding and sending ------------------------------------------------------------

    def encoded_input(self, index: int) -> bytes | PickleParts:
        """The input as it travels: a small plain value as msgpack (`inline_values`), else pickled."""
        data = inline_values.pack_input(self.inputs[index])
        return self.pickled_input(index) if data is None else data

    def pickled_input(self, index: int) -> bytes | PickleParts:
        """The input pickled: in parts if it holds a large buffer (pickle_parts: sent without a copy
        of its own)."""
        ahead = self._pickled_ahead
        if ahead is not None and ahead[0] == index:  # pickled by first_batch: a large input, once
            self._pickled_ahead = None
            return ahead[1]
        try:
            data = dumps_input(self.inputs[index])
        except Exception as e:
            raise UnpicklableInput(index, f"{type(e).__name__}: {e}") from e
        if len(data) > MAX_INPUT_BYTES:
            raise InputTooBig(index, len(data), MAX_INPUT_BYTES)
        return data

    def first_batch(self) -> list:
        """The first inputs, to travel in the opening's frame (up to FIRST_BATCH_ITEMS and
        FIRST_BATCH_BYTES: a large input goes later, by itself or by file, so the opening stays
        small). Pickled before the job opens: one that can't be pickled stops the job before the
        head starts it."""
        batch: list = []
        size = 0
        for index in range(min(len(self.inputs), FIRST_BATCH_ITEMS)):
            data = self.encoded_input(index)
            size += len(data)
            if size > FIRST_BATCH_BYTES:
                self._pickled_ahead = (index, data)  # the upload takes it from here
                break
            batch.append([index, data])
        return batch

    def first_batch_sent(self, batch: list) -> int:
        """The first inputs went out with the opening: they count in the window; returns how many."""
        if batch:
            for index, data in batch:
                self.leave_window(index)  # sent before on a connection that closed at once
                self.sizes[index] = len(data)
            self._count_out(len(batch), sum(len(data) for _, data in batch), batch[-1][0])
        return len(batch)

    async def upload(self, send: Send, start: int) -> None:
        """Encode and send inputs from `start` while the window allows; a detaching client then
        waits until the head has saved them all."""
        job_id = self.job_id
        batch = _Batch()
        inputs, received, sizes = self.inputs, self.received, self.sizes
        # The first batches are small, so the workers start while the rest is pickled; they double
        # up to UPLOAD_BATCH_ITEMS, where a frame's cost per input is already small.
        batch_items = FIRST_UPLOAD_BATCH_ITEMS
        # Per input, the loop counts what it sends in locals and checks them against the room the
        # window had when the counters were last brought up to date (`_count_out`), which happens
        # before every await: only then can results free the window.
        room_inputs, room_bytes = self._room()
        taken_inputs = taken_bytes = 0
        last = start - 1
        index, n_inputs = start - 1, len(inputs)
        one_by_one_until = start  # inputs before this go one by one (a run of them was not all plain)
        try:
            while index + 1 < n_inputs:  # once per input, or per run of small plain ones
                index += 1
                if index >= one_by_one_until:
                    # A run of small plain values within the batch's and the window's room: encoded
                    # together at C speed, where the rest go one by one.
                    run, run_sizes = self._plain_run(index, min(n_inputs, index + batch_items - len(batch)),
                                                     room_inputs - taken_inputs, room_bytes - taken_bytes)
                    if run_sizes:
                        taken_inputs += len(run_sizes)
                        taken_bytes += len(run)
                        batch.add_run(index, run, run_sizes)
                        index = last = index + len(run_sizes) - 1
                    else:
                        one_by_one_until = index + _RUN_MIN_ITEMS
                if index != last:  # not taken in a run: this input by itself
                    if received[index]:
                        continue
                    data, size = self._encoded(index)
                    if taken_inputs >= room_inputs or taken_bytes + size > room_bytes:
                        self._count_out(taken_inputs, taken_bytes, last)
                        taken_inputs = taken_bytes = 0
                        if batch:
                            await send(batch.message(job_id))
                            batch = _Batch()
                        await self._room_for(size)
                        room_inputs, room_bytes = self._room()
                    taken_inputs += 1
                    taken_bytes += size
                    last = index
                    sizes[index] = size
                    batch.add(index, data)
                if batch.bytes >= UPLOAD_BATCH_BYTES or len(batch) >= batch_items:
                    self._count_out(taken_inputs, taken_bytes, last)
                    taken_inputs = taken_bytes = 0
                    await send(batch.message(job_id))
                    batch = _Batch()
                    batch_items = min(UPLOAD_BATCH_ITEMS, batch_items * 2)
                    await asyncio.sleep(0)  # results that came back meanwhile are taken between batches
                    room_inputs, room_bytes = self._room()
            self._count_out(taken_inputs, taken_bytes, last)
            taken_inputs = taken_bytes = 0
            if batch:
                await send(batch.message(job_id))
        finally:
            self._count_out(taken_inputs, taken_bytes, last)  # an input that can't be sent ends the upload
        if self.detaching:
            await self._wait_until_kept()

    def _plain_run(self, start: int, end: int, room_inputs: float, room_bytes: float) -> tuple[bytes, array]:
        """The longest run of inputs from `start` (up to `end`) that are small plain values whose
        results are not in yet, as they travel (end to end, and each one's size), if it is at least
        _RUN_MIN_ITEMS long and the window has room for it (their sizes noted); else nothing. None
        goes by file: an inline value is far smaller than INPUT_FILE_MIN_BYTES."""
        # Each such input weighs at least 2 bytes (its mark and one byte of msgpack).
        end = start + int(min(room_inputs, room_bytes // 2, end - start))
        received = self.received[start:end]
        end = start + len(received) - len(received.lstrip(b"\0"))  # up to the first input whose result is in
        if end - start < _RUN_MIN_ITEMS:
            return b"", array("I")
        data, sizes = inline_values.pack_run(self.inputs, start, end)
        if len(data) > room_bytes:  # as many as the window's bytes take
            ends = list(accumulate(sizes))
            fit = bisect_right(ends, room_bytes)
            data, sizes = data[:ends[fit - 1] if fit else 0], sizes[:fit]
        if len(sizes) < _RUN_MIN_ITEMS:
            return b"", array("I")
        self.sizes[start:start + len(sizes)] = sizes
        return data, sizes

    def _encoded(self, index: int) -> tuple[bytes | PickleParts, int]:
        """One input as it travels (inline, pickled or by file), and what it weighs in the window."""
        data = self.encoded_input(index)
        size = len(data)
        if size >= INPUT_FILE_MIN_BYTES and self.files is not None and not self.files_full:
            return self._by_file(index, data), size
        if size >= direct_inputs.DIRECT_MIN_BYTES and self.direct:
            self.direct_pending[index] = data
            return direct_inputs.placeholder(size), size
        return data, size

    def _room(self) -> tuple[float, float]:
        """How many more inputs, and bytes, the window takes now (a detaching client's is endless)."""
        if self.detaching:
            return math.inf, math.inf
        return self.window_inputs - self.outstanding_inputs, self.window_bytes - self.outstanding_bytes

    def _count_out(self, inputs: int, size: int, last: int) -> None:
        """Inputs the upload loop sent (up to index `last`) count in the window from now on."""
        self.outstanding_inputs += inputs
        self.outstanding_bytes += size
        if last >= self.sent_until:
            self.sent_until = last + 1

    async def _room_for(self, size: int) -> None:
        """Wait until the window takes one more input of `size` bytes: an input always goes when
        none is out, however big."""
        while not self.detaching and self.outstanding_inputs and (
            self.outstanding_inputs >= self.window_inputs or self.outstanding_bytes + size > self.window_bytes
        ):
            self.window_open.clear()
            await self.window_open.wait()

    async def _wait_until_kept(self) -> None:
        """Leave only once the head has saved every input, so that a head crash right after
        the client leaves loses none of them."""
        try:
            await asyncio.wait_for(self.kept.wait(), KEPT_CONFIRM_S)
        except TimeoutError:
            self.display.announce(
                f"the head did not confirm within {KEPT_CONFIRM_S:g} s that it saved this job's inputs; the job "
                "runs on, but if the head restarts before it ends some inputs may be missing from its results")
