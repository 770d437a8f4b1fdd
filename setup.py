"""Builds the optional C accelerator of xray.dump.stats; all metadata lives in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and xray uses torch for
statistics. No -march flags: the AVX2 kernel is picked at run time, so the build runs anywhere.
"""
import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "xray.dump._moments",
            ["xray/dump/_moments.c"],
            optional=True,
            extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
        )
    ]
)
