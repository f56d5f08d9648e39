"""The client: what runs in the user's process. `api` checks the arguments and finds (or starts)
the cluster; `session` opens a job, `runner` drives its connection and results, `upload` streams
its inputs; `loop` and `connections` are the process's one event loop and its kept connections;
`progress` draws the line users watch; `local_cluster` starts and finds heads on this machine.

Nothing is imported here: `import burla` stays fast and loads the rest on first use.
"""
