"""Data-parallel training: ``DistributedOptimizer`` (with Adasum's optimizer of its own), ZeRO,
dynamic loss scaling and starting every rank from the same state."""
