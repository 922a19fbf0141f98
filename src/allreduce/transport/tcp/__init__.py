"""TCP: one framed non-blocking link written once (:mod:`.link`) for the collective transport
(:mod:`.transport`: one connection per pair of ranks, all progressed by a single poll loop) and for
point-to-point (``p2p``); how links are made and proved (:mod:`.peering`); the words of their errors,
shared with the compiled TCP engine's Python side (:mod:`.wording`).
"""

from .peering import TcpPeering
from .transport import TcpTransport

__all__ = ["TcpPeering", "TcpTransport"]
