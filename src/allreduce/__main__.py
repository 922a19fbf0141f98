"""``python -m allreduce``: the same command line as the ``allreduce`` script.

A Ctrl-C that arrives while the command is still being imported (a worker that ``allreduce bench
-n`` or ``soak -n`` started, stopped at once) ends it with the shell's status for SIGINT, quietly.
"""

import sys

try:
    from .cli import main

    sys.exit(main())
except KeyboardInterrupt:
    sys.exit(130)
