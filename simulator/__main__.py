"""``python -m simulator`` is the ``clustersim`` command."""

from simulator.cli import console

console()
