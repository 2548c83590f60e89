"""`python -m heisd_libero <command>`: the `heisd-libero` command line without its console script."""

import sys

from heisd_libero.cli import main

sys.exit(main())
