"""The library's version, in a module of its own so that modules inside the package (``allreduce.MPI``'s
``Get_library_version``) read it without importing the package that imports them."""

__version__ = "0.1.0"
