"""``python -m ferrollm``: the same as the ``ferrollm`` command."""

import sys

from ferrollm.cli import main

sys.exit(main())
