"""A failed call's error as it travels in a result's place (the wire's API re-exports it:
`wire.ErrorRecord`, `wire.describe_error`, `wire.read_error`)."""

from __future__ import annotations

import msgpack

from burla.errors import ProtocolError
from burla.protocol.framing import Channel, Limits, Message, decode, message
from burla.protocol.limits import MAX_FRAME_BYTES, TEXT_BYTES


@message(37)
class ErrorRecord(Message):
    """A failed call's error, as a result payload. The head, CLI and dashboard read the typed
    fields; only the client unpickles `exception`, so a failing call can't run code in the head."""

    type_name: str  # the class's qualified name
    module: str  # the class's module
    message: str
    traceback: str  # formatted, as the worker saw it
    exception: bytes | None  # the cloudpickled exception, None if it can't travel
    frames: dict | None  # tblib's dict of the traceback, to re-raise with the remote frames
    node_id: str = ""  # where the call failed ("" where not known)
    host: str = ""
    worker_pid: int = 0  # 0: the node itself (a crashed worker's pid is given when known)
    attempts: int = 1  # how many times the call ran (the head counts retries)

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.type_name}" if self.module and self.module != "builtins" else self.type_name


def describe_error(exc: BaseException) -> bytes:
    """An error payload without a pickled object, for errors the head raises itself: the client
    re-creates exceptions of burla.errors from their name and message."""
    return ErrorRecord(type(exc).__qualname__, type(exc).__module__, str(exc), "", None, None).encode()


def read_error(payload: bytes) -> ErrorRecord:
    """The typed fields of an error payload, also one an earlier build wrote (kept in history) with
    fewer trailing fields, which take their defaults; raises ProtocolError if it is not one."""
    try:
        record = decode(payload, ERROR_RECORD)
    except ProtocolError:
        try:
            frame = msgpack.unpackb(payload, raw=False) if payload and 0x90 <= payload[0] <= 0x9f else None
        except (ValueError, msgpack.UnpackException):
            frame = None
        defaults = ErrorRecord.__init__.__defaults__ or ()
        missing = len(ErrorRecord.FIELDS) + 1 - len(frame) if isinstance(frame, list) else 0
        if not frame or frame[0] != ErrorRecord.TAG or not 0 < missing <= len(defaults):
            raise
        record = decode(msgpack.packb([*frame, *defaults[len(defaults) - missing:]]), ERROR_RECORD)
    assert isinstance(record, ErrorRecord)
    return record


ERROR_RECORD = Channel("error record", (ErrorRecord,), Limits(10_000, 10_000, TEXT_BYTES, MAX_FRAME_BYTES, 1_000_000))
