"""``python -m dedupsink.cli``: the ``dedupsink`` command."""

import sys

from dedupsink.cli.main import main

sys.exit(main())
