"""Tests are grouped by how they run: ``unit`` (pure, no processes), ``collectives`` and ``faults``
(forked ranks), ``rendezvous``, ``torch``, ``cli``, ``native`` (the compiled engine); what they share
is the ``support`` package. Modules marked ``engines`` run once per engine (``support/engines.py``);
the others run on the default, ``auto``: the compiled engine where it is built."""

from support.engines import engine, parametrize as pytest_generate_tests  # noqa: F401
