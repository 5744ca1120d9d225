"""``python -m ckptdash`` is the ``ckptdash`` command.

Guarded: ``panel serve ckptdash`` imports the modules a ``/components/...`` URL names, this
one included, and an unguarded ``sys.exit`` at import would end the server.
"""

import sys

if __name__ == "__main__":
    from ckptdash.cli import main

    sys.exit(main())
