"""How much one frame may carry, everywhere on the wire."""

from __future__ import annotations

from burla.protocol.framing import Limits

# The most inputs or results one frame carries between client, head and nodes in the usual
# course (fewer when they are large). A frame is one step of the head's event loop, which every
# other connection waits for: this bounds that step to a few milliseconds.
BATCH_ITEMS = 4096

# The most bytes of results one frame carries from a node, and from the head to a client (more
# only for a single larger result).
RESULT_FRAME_BYTES = 8 * 1024 * 1024

# The largest frame: one 200 MB input or 100 MB function plus its envelope.
MAX_FRAME_BYTES = 216 * 1024 * 1024

# The most inputs one job may have; the head keeps a little state per input.
MAX_INPUTS = 100_000_000
TEXT_BYTES = 64 * 1024 * 1024
CLIENT_FRAME_RESULTS = 2_000_000  # the most results one frame to a client carries (8 MB of tiny results)
NODE_FRAME_ITEMS = 200_000  # the most inputs, results or output chunks a node exchanges in one frame
MAX_COUNT = 2**40  # a count a node reports (NodeState)
# The most inputs of one job a node holds, queued or running (past twice its parallelism): the
# head's credit to a node never exceeds it, whatever the node asks for.
MAX_NODE_WINDOW = 20_000

# What a node sends (to its head, and a worker to its node): many results and output chunks.
NODE_REPORTS = Limits(NODE_FRAME_ITEMS, 10_000, TEXT_BYTES, MAX_FRAME_BYTES, 4 * NODE_FRAME_ITEMS)
# What a node is sent (by its head, to its workers, and a thief by its donor): inputs, short texts.
NODE_LINK = Limits(NODE_FRAME_ITEMS, 100_000, 1 << 20, MAX_FRAME_BYTES, 4 * NODE_FRAME_ITEMS)
