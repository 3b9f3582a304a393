"""The Pulumi program's entry point. Pulumi.yaml names no `main`, so the engine runs this file and
starts every plugin from the project root (see the comment there); the program is infra/program.py.
`python -m infra` is the command line, not the program."""
from infra.program import main

main()
