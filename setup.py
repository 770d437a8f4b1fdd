"""Builds xray's optional C accelerators and lists the packages; all other metadata lives in pyproject.toml.

xray.dump._moments: tensor statistics in one pass. ``optional=True``: without a C compiler the
install still succeeds and xray takes the torch path. No -march flags: the AVX2 kernel is
picked at run time, so the build runs anywhere.

xray-gen's Jinja templates live in the repository's top-level ``templates/`` folder; the wheel
carries them as the data package ``xray._templates``. ``xray-replay --spec common`` reads the
shipped sweep ``xray/replay/sweeps/common.yaml``.
"""
import sys

from setuptools import Extension, find_packages, setup

_FLAGS = [] if sys.platform == "win32" else ["-O3"]

setup(
    packages=[*find_packages(include=["xray", "xray.*"]), "xray._templates"],
    package_dir={"xray._templates": "templates"},
    package_data={"xray": ["py.typed", "gen/*.txt", "replay/sweeps/*.yaml"], "xray._templates": ["*.j2"]},
    ext_modules=[
        Extension(
            "xray.dump._moments",
            ["xray/dump/_moments.c"],
            optional=True,
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "xray.dump._pack",
            ["xray/dump/_pack.c"],
            optional=True,
            extra_compile_args=_FLAGS,
        ),
        Extension(
            "xray.record._fastpath",
            ["xray/record/_fastpath.c"],
            depends=["xray/dump/moments_api.h"],
            optional=True,
            # no fused multiply-add: its statistics must be the same floats as stats.py's
            extra_compile_args=_FLAGS + ([] if sys.platform == "win32" else ["-ffp-contract=off"]),
        ),
    ]
)
