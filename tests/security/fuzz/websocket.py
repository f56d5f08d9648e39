"""The WebSocket sessions of a generated request: the handshake headers and the frames sent to
the head's /v1/jobs/ws (a job opened or resumed, then its inputs, acks, cancels) and /v1/nodes/ws
(a node registered, then its state, results, output, credits, steals), each frame most often
well-formed and sometimes not."""

from __future__ import annotations

import base64
import pickle
import random
import sys

from burla._version import __version__
from burla.process.build import build_hash
from burla.protocol import wire
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import pack_indices
from tests.security.fuzz.model import Context, Route, describe
from tests.security.fuzz.transport import ws_frame
from tests.security.fuzz.values import defuse, message, mutate, pack, random_text, slot

PYTHON = "{}.{}.{}".format(*sys.version_info[:3])
BUILD = build_hash()
PICKLED_ABS = pickle.dumps(abs)


def _wrap(rng: random.Random, payload: bytes) -> tuple[bytes, bool, str]:
    """A WebSocket frame around a message: mostly a plain binary frame, sometimes not."""
    r = rng.random()
    if r < 0.85:
        return ws_frame(rng, 2, payload), False, f"binary {describe(payload)}"
    if r < 0.89:
        text = rng.choice([payload.decode("utf-8", "replace").encode(), b"hello", b"\xff\xfe", b"{}"])
        label = "text" if text != b"\xff\xfe" else "text not utf-8"
        return ws_frame(rng, 1, text), False, f"{label} {describe(text)}"
    if r < 0.92 and len(payload) > 1:
        cut = rng.randrange(1, len(payload))
        return (ws_frame(rng, 2, payload[:cut], fin=False) + ws_frame(rng, 0, payload[cut:]), False,
                f"fragmented {describe(payload)}")
    if r < 0.94:
        frame = ws_frame(rng, 2, payload)
        return frame[: rng.randrange(1, len(frame))], True, f"cut-off frame of {describe(payload)}"
    if r < 0.96:
        return ws_frame(rng, 2, payload, masked=False), False, f"unmasked {describe(payload)}"
    if r < 0.97:
        return ws_frame(rng, 2, payload, rsv=rng.choice([1, 2, 4])), False, f"reserved bits {describe(payload)}"
    if r < 0.98:
        return ws_frame(rng, rng.choice([3, 7, 11, 15]), payload), False, f"unknown opcode {describe(payload)}"
    if r < 0.99:
        ping = rng.choice([b"", b"p", b"x" * 200])
        # Control frames carry at most 125 bytes (RFC 6455 §5.5): a longer one is a violation.
        label = f"ping of {len(ping)} bytes"
        if len(ping) > 125:
            label = f"control frame over 125 bytes: {label}"
        return ws_frame(rng, 9, ping), False, label
    return ws_frame(rng, 0, payload), False, f"continuation without start {describe(payload)}"


def _open_job(rng: random.Random, ctx: Context) -> list:
    job_id = f"fuzzjob-{rng.getrandbits(40):010x}"
    ctx.job_ids.append(job_id)
    function_bytes = rng.choice([PICKLED_ABS, PICKLED_ABS, b"x", pickle.dumps(5), b"\x80\x05", b""])
    return message(
        wire.OpenJob, job_id=job_id, function_name="fuzz", function_bytes=function_bytes,
        n_inputs=rng.choice([1, 2, 3, 5, 10]), func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False,
        max_parallelism=None, detach=False, raise_errors=rng.random() < 0.5, region=None, disk_gb=None,
        parent_job_id=rng.choice([None, None, *ctx.job_ids[-3:]]), client_version=__version__,
        python_version=PYTHON, local_code=b"", packages={},
    )


def _job_follow_up(rng: random.Random, ctx: Context, job_id: str, n_inputs: int) -> list:
    r = rng.random()
    if r < 0.5:
        count = rng.choice([1, 1, 2, n_inputs])
        items = [[rng.choice([i, i, n_inputs, 2**32 - 1]) if rng.random() < 0.1 else i,
                  rng.choice([pickle.dumps(-i), pickle.dumps(-i), b"garbage", b""])] for i in range(count)]
        part = PackedInputs.of(items)
        if rng.random() < 0.1:  # parts that disagree: a size too many, or data longer than its sizes say
            part = rng.choice([PackedInputs(part.indices, part.sizes + b"\x01\x00\x00\x00", part.data),
                               PackedInputs(part.indices, part.sizes, part.data + b"x")])
        return message(wire.InputBatch, job_id=job_id, indices=part.indices, sizes=part.sizes, data=part.data)
    if r < 0.7:
        return message(wire.ResultAck, job_id=job_id, seq=rng.choice([0, 1, 2, -1, 10**6, 2**63 - 1]))
    if r < 0.8:
        return message(wire.CancelJob, job_id=job_id, reason=random_text(rng))
    if r < 0.9:
        return _open_job(rng, ctx)
    return message(wire.ResumeJob, job_id=job_id, acked_seq=rng.choice([0, -1, 2**63 - 1]))


def _error_record(rng: random.Random) -> bytes:
    msg = message(wire.ErrorRecord, type_name="ValueError", module="builtins", message=random_text(rng),
                  traceback=random_text(rng))
    return mutate(rng, msg) if rng.random() < 0.5 else pack(msg)


def _node_follow_up(rng: random.Random, ctx: Context, node_id: str) -> list:
    job_id = rng.choice(ctx.live_ids[-20:]) if ctx.live_ids and rng.random() < 0.8 else f"fuzz-{rng.getrandbits(16)}"
    index = rng.choice([0, 1, 2, -1, 10**9, 2**63 - 1])
    r = rng.random()
    if r < 0.25:
        jobs = [[job_id, rng.choice([0, 1, -1]), rng.choice([0, 5, 2**63 - 1]), rng.choice([0, 1])]]
        return message(wire.NodeState, node_id=node_id, status=rng.choice(["READY", "RUNNING", "x"]),
                       workers_alive=rng.choice([0, 1, 2]), jobs=rng.choice([[], jobs]), cpu_percent=12.5,
                       mem_percent=40.0, net_sent_bps=0.0, net_recv_bps=1e6)
    if r < 0.5:
        ok = rng.random() < 0.5
        payload = pickle.dumps(index) if ok else _error_record(rng)
        return message(wire.ResultBatch, job_id=job_id, seq=rng.choice([0, 1, 2**63 - 1]),
                       items=[[index, ok, payload]])
    if r < 0.62:
        return message(wire.OutputBatch, job_id=job_id, items=[[index, rng.choice([1, 2, 0, 3]), random_text(rng)]])
    if r < 0.74:
        return message(wire.Credit, job_id=job_id, inputs=rng.choice([0, 1, 100, -1, 2**63 - 1]))
    if r < 0.86:
        donor = rng.choice([*ctx.node_ids, node_id, "fuzz-donor"]) if ctx.node_ids else node_id
        return message(wire.Stolen, job_id=job_id, donor_id=donor, indices=[index, index])
    if r < 0.93:
        return message(wire.NodeLeaving, reason=random_text(rng))
    return _register(rng)


def _register(rng: random.Random) -> list:
    node_id = f"fuzznode-{rng.getrandbits(32):08x}"
    return message(wire.RegisterNode, node_id=node_id, url="http://127.0.0.1:9", slots=rng.choice([1, 2]), cpus=1,
                   ram_gb=1.0, gpu=None, gpu_count=0, image=None, region="local", python_version=PYTHON,
                   version=__version__, build=BUILD, held=_held(rng))


def _held(rng: random.Random) -> list:
    """What a node says it kept running while it had no head: usually nothing."""
    if rng.random() < 0.7:
        return []
    return [[f"fuzz-held-{rng.getrandbits(16):04x}", pack_indices([rng.randrange(1000) for _ in range(3)])]]


def ws_frames(rng: random.Random, ctx: Context, route: Route, authorized: bool) -> list[tuple[bytes, bool, str]]:
    frames: list[tuple[bytes, bool, str]] = []
    if route.template == "/v1/jobs/ws":
        if rng.random() < 0.8:
            first = _open_job(rng, ctx)
        else:
            first = message(wire.ResumeJob, job_id=rng.choice(ctx.live_ids[-10:] or ["none"]),
                            acked_seq=rng.choice([0, -1]))
        job_id = first[slot(wire.OpenJob, "job_id")]
        n_inputs = first[slot(wire.OpenJob, "n_inputs")] if first[0] == wire.OpenJob.TAG else 1
        follow = [(lambda: _job_follow_up(rng, ctx, job_id, n_inputs)) for _ in range(rng.choice([0, 1, 2, 3, 5]))]
    else:
        first = _register(rng)
        node_id = first[slot(wire.RegisterNode, "node_id")]
        follow = [(lambda: _node_follow_up(rng, ctx, node_id)) for _ in range(rng.choice([0, 1, 2, 3, 5, 8]))]
    # The opening frame is mostly well-formed, so that what follows reaches an open channel.
    well_formed = rng.random() < 0.6
    opening = pack(defuse(first)) if well_formed else mutate(rng, first)
    if well_formed and authorized and first[0] == wire.OpenJob.TAG:
        ctx.live_ids.append(job_id)
    frames.append(_wrap(rng, opening) if rng.random() < 0.2 else (ws_frame(rng, 2, opening), False,
                                                                  f"binary {describe(opening)}"))
    for make in follow:
        msg = make()
        payload = pack(defuse(msg)) if rng.random() < 0.6 else mutate(rng, msg)
        frames.append(_wrap(rng, payload))
        if frames[-1][1]:
            break  # a cut-off frame ends the stream
    return frames


def ws_handshake_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    key = base64.b64encode(rng.randbytes(16))
    headers = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Key", key),
               (b"Sec-WebSocket-Version", b"13")]
    r = rng.random()
    if r < 0.03:
        headers[2] = (b"Sec-WebSocket-Key", rng.choice([b"", b"short", b"\xff" * 24]))
    elif r < 0.06:
        headers[3] = (b"Sec-WebSocket-Version", rng.choice([b"8", b"", b"99"]))
    elif r < 0.08:
        headers.append((b"Sec-WebSocket-Extensions", b"permessage-deflate; client_max_window_bits"))
    elif r < 0.1:
        headers.append((b"Sec-WebSocket-Protocol", b"\xff, x"))
    return headers
