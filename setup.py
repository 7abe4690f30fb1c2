"""The package's one compiled part, optional: faultnet.planes._native (the native data
plane's forwarding core, C). Everything else is in pyproject.toml.

A machine without a C compiler (or without the Python headers) still installs: the build
of the extension fails with a warning and the pure-Python planes remain (faultnet.planes.
native then reports AVAILABLE = False). The breakages the tests need (the mutex skipped)
are runtime switches of the built core, not build variants.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns, and builds nothing, where the extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (DistutilsPlatformError and kin)
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError: CC=false, missing headers
            self._skip(exc)

    @staticmethod
    def _skip(exc: BaseException) -> None:
        print(
            f"warning: faultnet's native data plane was not built ({exc}); "
            "the pure-Python planes will be used",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "faultnet.planes._native",
            sources=["faultnet/planes/_native.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
