"""The bound on the results a node holds (burla/node/result_window.py): readers go on while the
node holds less than its window, wait once it holds more, and go on when results are sent or
dropped; a node running small frames never looks. The window at work in a real node, with its
head stopped, is in test_bulk_transfer.py."""

from __future__ import annotations

import asyncio

from burla.node.result_window import CHECK_EVERY, ResultWindow

MB = 1024 * 1024


class _Held:
    def __init__(self) -> None:
        self.bytes = 0
        self.looks = 0

    def __call__(self) -> int:
        self.looks += 1
        return self.bytes


async def test_small_frames_never_look_at_what_the_node_holds():
    held = _Held()
    window = ResultWindow(held, limit=64 * MB)
    held.bytes = 10 * 64 * MB  # even over the window: nothing is checked until a check is due
    assert all(window.room(100) is None for _ in range(CHECK_EVERY // 100 - 1))
    assert held.looks == 0


async def test_a_reader_waits_while_the_node_holds_more_than_its_window_until_some_is_sent():
    held = _Held()
    window = ResultWindow(held, limit=64 * MB)
    held.bytes = 60 * MB
    assert window.room(8 * MB) is None and not window.full()
    held.bytes = 68 * MB
    room = window.room(8 * MB)
    assert room is not None and window.full()
    # Another reader that comes while it is full waits too, without reading first.
    second = window.room(0)
    assert second is not None
    waiting = asyncio.gather(room, second)
    await asyncio.sleep(0.05)
    assert not waiting.done()
    held.bytes = 64 * MB
    window.sent()
    await asyncio.wait_for(waiting, 10)
    assert not window.full() and window.waits == 2
    assert window.room(0) is None


async def test_results_dropped_without_a_word_free_a_waiting_reader():
    held = _Held()
    window = ResultWindow(held, limit=MB)
    held.bytes = 2 * MB
    room = window.room(CHECK_EVERY)
    assert room is not None
    task = asyncio.ensure_future(room)
    await asyncio.sleep(0.05)
    assert not task.done()
    held.bytes = 0  # a job cancelled: its results dropped, and nobody calls sent()
    await asyncio.wait_for(task, 10)
    assert not window.full()
