"""Builds xray's optional C accelerators; all metadata lives in pyproject.toml.

xray.dump._moments: tensor statistics in one pass. ``optional=True``: without a C compiler the
install still succeeds and xray takes the torch path. No -march flags: the AVX2 kernel is
picked at run time, so the build runs anywhere.
"""
import sys

from setuptools import Extension, setup

_FLAGS = [] if sys.platform == "win32" else ["-O3"]

setup(
    ext_modules=[
        Extension(
            "xray.dump._moments",
            ["xray/dump/_moments.c"],
            optional=True,
            extra_compile_args=_FLAGS,
        ),
    ]
)
