"""Horovod's ``horovod.torch`` API (``import allreduce.torch as hvd``): its operations, handles,
process sets, ``join`` and Adasum."""
