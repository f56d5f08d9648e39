"""The client's upload window, without a head: inputs go out while the window has room, wait
while it is full, go again as results free it, each exactly once and in order; an input bigger
than the window goes alone; a reconnect sends again what never reached the head; an input that
can't be pickled stops the upload with an error that says so."""

from __future__ import annotations

import asyncio
import io
import pickle
import threading

import pytest

from burla.client.progress import Display
from burla.client.upload import Uploader
from burla.errors import UnpicklableInput
from burla.protocol import wire


def _uploader(inputs: list, detaching: bool = False) -> Uploader:
    display = Display(len(inputs), show_progress=False, stdout=io.StringIO(), stderr=io.StringIO())
    return Uploader("j", inputs, bytearray(len(inputs)), display, detaching)


class Head:
    """Takes the uploader's frames and answers with results when told to."""

    def __init__(self, uploader: Uploader) -> None:
        self.uploader = uploader
        self.sent: list[int] = []
        self.in_flight: list[int] = []

    async def send(self, msg: wire.Message) -> None:
        assert isinstance(msg, wire.InputBatch)
        indices = msg.part().index_list()
        self.sent += indices
        self.in_flight += indices
        # The window is never over its count, nor over its bytes but for a lone input.
        assert len(self.in_flight) <= self.uploader.window_inputs
        sizes = [self.uploader.sizes[i] for i in self.in_flight]
        assert sum(sizes) <= self.uploader.window_bytes or len(sizes) == 1

    def answer(self, count: int) -> None:
        done, self.in_flight = self.in_flight[:count], self.in_flight[count:]
        for index in done:
            self.uploader.received[index] = 1
        self.uploader.results_in(list(done))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _uploading(inputs: list, window: tuple[int, int]) -> tuple[Uploader, Head, asyncio.Task]:
    """An upload of `inputs` under `window`, started and run until it waits."""
    uploader = _uploader(inputs)
    head = Head(uploader)
    uploader.resume(0, window)
    upload = asyncio.create_task(uploader.upload(head.send, 0))
    await _settle()
    return uploader, head, upload


async def test_inputs_wait_for_room_and_go_once_each_in_order():
    uploader, head, upload = await _uploading(list(range(50)), (8, 1 << 20))
    assert head.sent == list(range(8)) and not upload.done()  # the window is full: it waits
    while not upload.done():
        head.answer(3)
        await _settle()
    await upload
    assert head.sent == list(range(50))
    head.answer(len(head.in_flight))
    assert (uploader.outstanding_inputs, uploader.outstanding_bytes) == (0, 0)


async def test_an_input_bigger_than_the_window_goes_alone():
    _, head, upload = await _uploading([b"a" * 10, b"b" * 5000, b"c" * 10, b"d" * 10], (100, 1000))
    assert head.sent == [0]  # the big one waits until nothing is out
    head.answer(1)
    await _settle()
    assert head.sent == [0, 1]  # then goes alone
    head.answer(1)
    await _settle()
    await upload
    assert head.sent == [0, 1, 2, 3]


async def test_a_reconnect_sends_again_what_never_reached_the_head():
    uploader, head, upload = await _uploading(list(range(20)), (10, 1 << 20))
    assert head.sent == list(range(10))
    upload.cancel()  # the connection dropped while the loop waited for room
    with pytest.raises(asyncio.CancelledError):
        await upload
    # The head had received 0..5 and had results for 0..2 (the client has them now).
    for index in range(3):
        uploader.received[index] = 1
    uploader.results_in(list(range(3)))
    uploader.resume(6, (10, 1 << 20))
    assert uploader.outstanding_inputs == 3  # 3, 4 and 5 are still out; 6..9 go again
    again = Head(uploader)
    upload = asyncio.create_task(uploader.upload(again.send, 6))
    await _settle()
    assert again.sent == list(range(6, 13))  # then the window (3 out + 7) is full
    assert uploader.outstanding_inputs == 10 and not upload.done()
    upload.cancel()
    with pytest.raises(asyncio.CancelledError):
        await upload


async def test_a_detaching_client_sends_everything_whatever_the_window():
    uploader = _uploader(list(range(30)), detaching=True)
    sent: list[int] = []

    async def send(msg: wire.Message) -> None:
        assert isinstance(msg, wire.InputBatch)
        sent.extend(msg.part().index_list())
        if len(sent) == 30:
            uploader.kept.set()  # the head says it saved them all

    uploader.resume(0, (2, 10))
    await uploader.upload(send, 0)
    assert sent == list(range(30))
    assert [pickle.loads(uploader.pickled_input(i)) for i in (0, 29)] == [0, 29]


def _mixed_inputs() -> list:
    """Runs of small plain values (taken together) broken by values that are not: pickled ones,
    an int past 64 bits, a str too long or not encodable as UTF-8."""
    inputs: list = []
    for run in range(12):
        inputs += [run * 1000 + i for i in range(37 * run)]
        inputs += [1.5, None, True, "short", "x" * 256][: run % 6]
        inputs.append([(2**70, b"bytes"), "x" * 257, "lone \udc80 surrogate", 2**64, -(2**63) - 1][run % 5])
    return inputs


async def test_runs_of_small_plain_inputs_go_together_and_others_one_by_one():
    from burla.node.workers.worker import _decoded_arguments

    inputs = _mixed_inputs()
    for window in ((50, 1 << 20), (1000, 600), (10**6, 1 << 20)):  # full by count, by bytes; roomy
        uploader = _uploader(inputs)
        head = Head(uploader)
        arguments: dict[int, object] = {}

        async def keep(msg: wire.Message, uploader: Uploader = uploader, head: Head = head,
                       arguments: dict = arguments) -> None:
            assert isinstance(msg, wire.InputBatch)
            part = msg.part()
            for index, data in part.items():
                arguments[index] = _decoded_arguments(data)
                assert uploader.sizes[index] == len(data)  # what it weighs in the window
            await head.send(msg)  # which checks the window

        uploader.resume(0, window)
        upload = asyncio.create_task(uploader.upload(keep, 0))
        while not upload.done():
            await _settle()
            head.answer(7)
        await upload
        assert head.sent == list(range(len(inputs)))  # each once, in order
        assert [arguments[i] for i in range(len(inputs))] == inputs


async def test_a_run_skips_inputs_whose_results_are_in():
    uploader = _uploader(list(range(300)))
    head = Head(uploader)
    for index in (0, 17, 18, 150, 299):
        uploader.received[index] = 1  # their results came in before a reconnect
    uploader.resume(0, (1000, 1 << 20))
    await uploader.upload(head.send, 0)
    assert head.sent == [i for i in range(300) if i not in (0, 17, 18, 150, 299)]


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled")


async def test_an_input_that_cant_be_pickled_stops_the_upload_with_a_clear_error():
    uploader = _uploader([1, 2, Unpicklable(), 4])
    head = Head(uploader)
    uploader.resume(0, (100, 1 << 20))
    with pytest.raises(UnpicklableInput, match="refuses to be pickled"):
        await uploader.upload(head.send, 0)
    assert head.sent == []  # 0 and 1 were still in the first batch: nothing went (the job ends)


def test_the_opening_carries_only_small_first_inputs(monkeypatch):
    from burla.client import upload
    from burla.client.upload import FIRST_BATCH_BYTES, FIRST_BATCH_ITEMS

    small = _uploader(list(range(1000)))
    assert [index for index, _ in small.first_batch()] == list(range(FIRST_BATCH_ITEMS))
    # A large first input goes later, by itself (or by file): the opening stays small. It is
    # pickled once, not again by the upload.
    pickled = []
    dumps_input = upload.dumps_input
    monkeypatch.setattr(upload, "dumps_input", lambda value: pickled.append(value) or dumps_input(value))
    large = _uploader([b"x" * (FIRST_BATCH_BYTES + 1), 1, 2])
    assert large.first_batch() == []
    assert pickle.loads(large.pickled_input(0)) == large.inputs[0]
    assert len(pickled) == 1
    mixed = _uploader([b"x" * (FIRST_BATCH_BYTES // 2)] * 3)
    batch = mixed.first_batch()
    assert [index for index, _ in batch] == [0] and sum(len(data) for _, data in batch) <= FIRST_BATCH_BYTES
    with pytest.raises(UnpicklableInput):  # stops the job before it opens
        _uploader([1, threading.Lock()]).first_batch()
