"""``python -m lra.table``: the command line of :func:`lra.table.main`."""

from . import main

main()
