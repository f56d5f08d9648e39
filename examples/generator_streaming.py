"""Streaming: generator=True yields each result as soon as its call finishes."""

import random
import time

from burla import remote_parallel_map


def slow_square(x: int) -> tuple[int, int]:
    time.sleep(random.uniform(0.1, 1.0))
    return x, x * x


if __name__ == "__main__":
    for x, square in remote_parallel_map(slow_square, range(12), generator=True):
        print(f"{x}^2 = {square}", flush=True)
