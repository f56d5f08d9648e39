"""`python -m burla`: the `burla` command."""

from burla.cli import main

main()
