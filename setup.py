"""The compiled engine's extensions; everything else about the package is in pyproject.toml.

Each ``src/allreduce/native/_<name>.c`` becomes the extension ``allreduce.native._<name>``, built with
the other ``.c`` files of that folder (the code they share). The extensions are optional: without a C
compiler the package installs and runs on its pure-Python engine.
"""

from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
NATIVE = Path("src/allreduce/native")
shared = sorted(str(p) for p in (HERE / NATIVE).glob("[!_]*.c"))
extensions = [
    Extension(f"allreduce.native.{path.stem}", sources=[str(NATIVE / path.name), *[str(Path(s).relative_to(HERE)) for s in shared]],
              include_dirs=[str(NATIVE)], extra_compile_args=["-O3", "-std=gnu11"], optional=True)
    for path in sorted((HERE / NATIVE).glob("_*.c"))
]

setup(ext_modules=extensions)
