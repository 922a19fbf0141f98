"""Build the torch backend's C++ shim once, before any test forks ranks (they inherit it loaded)."""

try:
    import torch  # noqa: F401
except ImportError:  # the optional extra is absent: the torch tests skip themselves
    pass
else:
    import os

    from allreduce.torch.c10d import native

    native.python_backend(os.environ)
