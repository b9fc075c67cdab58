"""``python -m dedupsink``: the ``dedupsink`` command (see :mod:`dedupsink.cli.main`)."""

import sys

from dedupsink.cli.main import main

sys.exit(main())
