"""Tests are grouped by how they run: ``unit`` (pure, no processes), ``collectives`` and ``faults``
(forked ranks), ``rendezvous``, ``torch``, ``cli``; what they share is the ``support`` package."""
