"""The optional C extension (gluon_data.format._jpegregion: exact region decoding of JPEGs with
libjpeg-turbo). Everything else is configured in pyproject.toml.

The extension needs a C compiler and libjpeg-turbo's headers (``apt install libjpeg-dev``,
``dnf install libjpeg-turbo-devel``). Without them the install goes on, pure Python, with a
one-line warning, and gluon_data decodes whole images and crops them (the same pixels).
``GLUON_DATA_BUILD_EXT=0`` skips the extension; ``GLUON_DATA_BUILD_EXT=1`` requires it (a
failed build fails the install: CI sets it so the extension cannot silently go missing).
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_MODE = os.environ.get("GLUON_DATA_BUILD_EXT", "auto").strip().lower()


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed build into a warning unless GLUON_DATA_BUILD_EXT=1."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (distutils raises before building)
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # no jpeglib.h, no libjpeg, a compile error
            self._skip(e)

    @staticmethod
    def _skip(e):
        if _MODE in ("1", "yes", "true"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write("WARNING: gluon_data's optional JPEG region decoder was not built "
                         "(%s); install a C compiler and libjpeg-turbo headers (libjpeg-dev) "
                         "for it. gluon_data works without it (whole-image decodes).\n" % first)


_SKIP = _MODE in ("0", "no", "false")  # a pure-Python wheel
setup(
    ext_modules=[] if _SKIP else [
        Extension("gluon_data.format._jpegregion", ["gluon_data/format/_jpegregion.c"], libraries=["jpeg"],
                  optional=_MODE not in ("1", "yes", "true"))],
    cmdclass={"build_ext": OptionalBuildExt},
)
