"""``python -m reservoir``: the ``reservoir`` command."""

from reservoir.cli import main

main(prog_name="reservoir")
