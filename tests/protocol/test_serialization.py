"""Pickling of functions, inputs and exceptions."""

from __future__ import annotations

import threading
import traceback

import pytest

from burla.errors import RemoteError, UnpicklableFunction
from burla.protocol.values.serialization import dumps, dumps_function, loads, pack_error, unpack_error


def test_plain_values_round_trip():
    for value in (1, 2.5, "s", b"b", None, (1, "a"), [1, 2], {"a": 1}, lambda: 3):
        restored = loads(dumps(value))
        if callable(value):
            assert restored() == 3
        else:
            assert restored == value


def test_unpicklable_closure_is_named():
    lock = threading.Lock()

    def uses_it(x):
        with lock:
            return x

    with pytest.raises(UnpicklableFunction, match="closure variable 'lock'"):
        dumps_function(uses_it)


def test_error_round_trip_keeps_type_traceback_and_index():
    def inner():
        raise KeyError("missing")

    try:
        inner()
    except KeyError as e:
        payload = pack_error(e)
    error = unpack_error(payload, 12)
    assert isinstance(error, KeyError) and error.burla_input_index == 12
    assert "inner" in "".join(traceback.format_tb(error.__traceback__))


def test_exception_that_cannot_be_rebuilt_becomes_remote_error():
    class NeedsTwo(Exception):
        def __init__(self, a, b):
            super().__init__(a)

    try:
        raise NeedsTwo(1, 2)
    except NeedsTwo as e:
        payload = pack_error(e)
    error = unpack_error(payload, 0)
    assert isinstance(error, RemoteError) and "NeedsTwo" in error.type_name
