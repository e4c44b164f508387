"""The one C module, which pyproject.toml cannot declare without an experimental table: the
sample scanner's line census (``service/adapters/_census.c``). Everything else about the
package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "service.adapters._census",
            sources=["service/adapters/_census.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        )
    ]
)
