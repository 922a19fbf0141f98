"""``python -m allreduce``: the same command line as the ``allreduce`` script."""

import sys

from allreduce.cli import main

sys.exit(main())
