"""Leave a process without a free file descriptor, and give them back: for the tests of ``EMFILE``."""

from __future__ import annotations

import errno
import os
import resource


def exhaust() -> tuple[tuple[int, int], list[int]]:
    """Lower the soft descriptor limit to what is open and fill the gaps below it; returns what
    :func:`restore` needs."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1, limits[1]))
    fillers = []
    while True:
        try:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
            return limits, fillers


def restore(limits: tuple[int, int], fillers: list[int]) -> None:
    for fd in fillers:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)
