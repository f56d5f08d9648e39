"""Quickstart: run a function on every CPU of this machine through burla's embedded cluster."""

import math

from burla import remote_parallel_map


def count_primes(start: int) -> int:
    """Count the primes in [start, start + 20,000)."""
    return sum(
        1
        for n in range(max(start, 2), start + 20_000)
        if all(n % d for d in range(2, math.isqrt(n) + 1))
    )


if __name__ == "__main__":
    starts = [i * 20_000 for i in range(20)]
    counts = remote_parallel_map(count_primes, starts)
    for start, count in zip(starts, counts):  # results come back in input order
        print(f"{count:5d} primes in [{start:,}, {start + 20_000:,})")
    print(f"{sum(counts)} primes below {starts[-1] + 20_000:,}")
