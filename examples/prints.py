"""Prints: whatever a call writes (print, C extensions, child processes) appears here live."""

import os
import subprocess
import sys
import time

from burla import remote_parallel_map


def talk(n: int) -> int:
    for step in range(3):
        print(f"call {n}: step {step}", flush=True)
        time.sleep(0.3)
    print(f"call {n}: a warning on stderr", file=sys.stderr)
    subprocess.run(["echo", f"call {n}: from a child process"], check=True)
    os.write(1, f"call {n}: straight to file descriptor 1\n".encode())
    return n


if __name__ == "__main__":
    print(remote_parallel_map(talk, range(4)))
