"""``python -m ckptdash`` is the ``ckptdash`` command."""

import sys

from ckptdash.cli import main

sys.exit(main())
