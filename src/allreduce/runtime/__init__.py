"""The runtime: a process group and what runs its calls in order (see :mod:`.group`)."""

from .group import ProcessGroup
from .request import Request
from .shortcuts import Shape

__all__ = ["ProcessGroup", "Request", "Shape"]
