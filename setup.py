"""The one C module, which pyproject.toml cannot declare without an experimental table: the
per-byte loops of datasets and round files (``service/adapters/_lines.c``: the line census
and a round's index entries). Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "service.adapters._lines",
            sources=["service/adapters/_lines.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        )
    ]
)
