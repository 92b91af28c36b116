"""``python -m simulator`` is the ``clustersim`` command."""

import sys

from simulator.cli import main

sys.exit(main())
