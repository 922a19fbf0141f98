"""Transports move bytes between ranks and know nothing of algorithms.

The interface every transport offers is one call, :meth:`exchange`: post a batch of sends and receives
(each a header plus a memoryview) and progress them all concurrently until they are done or the
deadline passes. The executor turns each step of a schedule into one exchange.
"""

from .base import RecvSpec, SendSpec, Transport

__all__ = ["RecvSpec", "SendSpec", "Transport"]
