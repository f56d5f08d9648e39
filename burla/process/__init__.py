"""What a burla process runs on, whatever its role: its exact build, forking and lifelines,
supervisors that restart processes and loops, and its memory (the garbage collector's settings)."""
