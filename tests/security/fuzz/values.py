"""Random values for the fields of requests and messages, often an edge of their type, and
msgpack messages of the wire protocol, well-formed or mutated into something malformed."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import msgpack

from burla.protocol import limits, wire
from burla.protocol.validation import packages_problem

MAX_STRING = 100 * 1024
MAX_INPUTS_OF_A_FUZZ_JOB = 1000  # jobs the fuzzer opens stay small: the head keeps state per input

UNICODE = ["jöb", "☃", "日本語", "🙂", "\u202eevil", "a\u200bb", "Ω≈ç√", "\x00", "tab\there", "new\nline", "ﬁ", "İ"]
SURROGATES = ["\ud800", "\udfff", "a\ud800b", "\udc80\udc80"]
WILD_INTS = [0, 1, -1, 2, 3, 7, 2**31, -(2**31), 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, limits.MAX_INPUTS + 1]
WILD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.5, -1.5]


def random_text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return rng.choice(UNICODE) * rng.choice([1, 2, 20])
    if r < 0.45:
        return rng.choice(SURROGATES)
    if r < 0.55:
        return "x" * rng.choice([300, 5000, MAX_STRING])
    if r < 0.65:
        return rng.choice(["", " ", "-x", "../../etc/passwd", "' OR 1=1 --", "%", "%%", "_", "\\", "null", "NaN"])
    return "".join(rng.choice("abcXYZ019_.-") for _ in range(rng.randint(1, 24)))


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def wild_value(rng: random.Random) -> Any:
    """A value of a random type, often an edge of its type."""
    r = rng.random()
    if r < 0.22:
        return rng.choice(WILD_INTS)
    if r < 0.34:
        return rng.choice(WILD_FLOATS)
    if r < 0.56:
        return random_text(rng)
    if r < 0.66:
        return rng.choice([b"", b"\x00", b"\xff" * 10, b"\x80\x05N.", rng.randbytes(rng.choice([1, 64, 4096]))])
    if r < 0.72:
        return rng.choice([None, True, False])
    if r < 0.86:
        return rng.choice([[], [[]], [1, "a"], [[0, b"x"]], [[0, True, b"x"]], [[0, 1, "t"]], ["j", 1, 2, 3],
                           list(range(rng.choice([100, 5000])))])
    if r < 0.95:
        return rng.choice([{}, {"a": 1}, {1: 2}, {b"k": b"v"}, {"numpy": 1}, {"../x": "1.0"}, {"": ""}])
    return _nested(rng.choice([10, 40, 200]))


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, unicode_errors="surrogatepass")


_DEFAULTS = {"int": 0, "float": 0.0, "bool": False, "str": "", "bytes": b"", "list": [], "dict": {}}


def message(cls: type[wire.Message], **values: Any) -> list:
    """A message as the list its frame holds, `[TAG, field...]`: the values given, and for any
    other field (the protocol grows) the empty value of its type."""
    fields = []
    for name in cls.FIELDS:
        if name in values:
            fields.append(values[name])
            continue
        annotation = cls.__annotations__.get(name, "None")
        kinds = [part.strip().split("[", 1)[0] for part in str(annotation).split("|")]
        fields.append(None if "None" in kinds else _DEFAULTS.get(kinds[0]))
    return [cls.TAG, *fields]


def _wild_fields(rng: random.Random, msg: list) -> bytes:
    for _ in range(rng.choice([1, 1, 2, 3])):
        if len(msg) > 1:
            msg[rng.randrange(1, len(msg))] = wild_value(rng)
    return pack(defuse(msg))


def _wrong_length(rng: random.Random, msg: list) -> bytes:
    return pack(defuse(msg[:-1] if rng.random() < 0.5 else [*msg, wild_value(rng)]))


def _wrong_tag(rng: random.Random, msg: list) -> bytes:
    msg[0] = rng.choice([0, -1, 19, 43, 99, 2**32, 2**64 - 1, "1", 1.0, None, *wire.REGISTRY])
    return pack(defuse(msg))


def _not_an_array(rng: random.Random, msg: list) -> bytes:
    return pack(rng.choice([{msg[0]: msg[1:]}, [], "frame", 5, None, msg[1:]]))


def _truncated(rng: random.Random, msg: list) -> bytes:
    packed = pack(defuse(msg))
    return packed[: rng.randrange(len(packed))]


def _trailing_bytes(rng: random.Random, msg: list) -> bytes:
    return pack(defuse(msg)) + rng.choice([b"\x00", b"\xc1", rng.randbytes(16)])


def _deep_nesting(rng: random.Random, msg: list) -> bytes:
    depth = rng.choice([100, 1000, 100_000])
    return rng.choice([b"\x91" * depth + b"\xc0", b"\x92\x01" + b"\x91" * depth + b"\xc0"])


def _random_bytes(rng: random.Random, msg: list) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 7, 100, 5000]))


def _odd_msgpack(rng: random.Random, msg: list) -> bytes:
    return rng.choice([
        b"\x81\x90\x01",  # a map whose key is an array
        b"\x92\x01\xd4\x05\x00",  # an ext type
        b"\x92\x01\xd6\xff\x00\x00\x00\x01",  # a timestamp
        b"\xdd\xff\xff\xff\xff",  # an array that claims 4 billion items
        b"\xdb\x7f\xff\xff\xff",  # a str that claims 2 GB
        b"\xc1",  # never used
    ])


def _surrogate(rng: random.Random, msg: list) -> bytes:
    if len(msg) > 1:
        msg[rng.randrange(1, len(msg))] = rng.choice(SURROGATES)
    return pack(defuse(msg))


# How often each kind of frame is made: (up to this cumulative probability, how).
_MUTATIONS: list[tuple[float, Callable[[random.Random, list], bytes]]] = [
    (0.12, lambda rng, msg: pack(defuse(msg))),  # as is
    (0.6, _wild_fields),
    (0.65, _wrong_length),
    (0.7, _wrong_tag),
    (0.74, _not_an_array),
    (0.8, _truncated),
    (0.84, _trailing_bytes),
    (0.88, _deep_nesting),
    (0.92, _random_bytes),
    (0.96, _odd_msgpack),
    (1.0, _surrogate),
]


def mutate(rng: random.Random, msg: list) -> bytes:
    """A frame from a well-formed message, most often with something wrong in it."""
    r = rng.random()
    how = next(how for up_to, how in _MUTATIONS if r < up_to)
    return how(rng, list(msg))


def defuse(msg: list) -> list:
    """Nothing a frame asks for may leave loopback or take the head's memory: no package a node
    would install, no job of millions of inputs, no node URL beyond loopback."""
    if not msg:
        return msg
    if msg[0] == wire.OpenJob.TAG and len(msg) == len(wire.OpenJob.FIELDS) + 1:
        packages = msg[slot(wire.OpenJob, "packages")]
        if isinstance(packages, dict) and packages and packages_problem(packages) is None:
            msg[slot(wire.OpenJob, "packages")] = {}
        n_inputs = msg[slot(wire.OpenJob, "n_inputs")]
        if type(n_inputs) is int and MAX_INPUTS_OF_A_FUZZ_JOB < n_inputs <= limits.MAX_INPUTS:
            msg[slot(wire.OpenJob, "n_inputs")] = MAX_INPUTS_OF_A_FUZZ_JOB
    url = slot(wire.RegisterNode, "url")
    if msg[0] == wire.RegisterNode.TAG and len(msg) > url and isinstance(msg[url], str) and "://" in msg[url]:
        msg[url] = "http://127.0.0.1:9"  # the URL other nodes steal from: loopback, where nothing listens
    return msg


def slot(cls: type[wire.Message], name: str) -> int:
    """Where a field sits in a message's frame list (after the tag)."""
    return cls.FIELDS.index(name) + 1
