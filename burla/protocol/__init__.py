"""What every process shares: the wire's messages (`wire`) and their framing (`framing`), packed
inputs, states, serialization of user objects, input files, local code and the environment a job
replicates, argument validation, steal grants, the worker context user code reads, and the view
records the head sends and the CLI reads. No module here imports a role's folder."""
