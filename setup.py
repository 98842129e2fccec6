"""The optional C extensions. Everything else is configured in pyproject.toml.

* gluon_data.format._jpegregion: exact region decoding of JPEGs with libjpeg-turbo. It needs a C
  compiler and libjpeg-turbo's headers (``apt install libjpeg-dev``, ``dnf install
  libjpeg-turbo-devel``); without it gluon_data decodes whole images and crops them (the same
  pixels).
* gluon_data.format._maskrle: run-length mask expansion at memset speed, and a crop's labels
  written straight from the runs (a C compiler only); without it numpy expands the same bytes
  to the same pixels (fast with numpy >= 2, about PNG's speed with numpy 1.x).
* gluon_data.convert._moments: a conversion's pixel statistics in one pass (a C compiler only);
  without it OpenCV's histograms give the same numbers, 3-4x slower.
* gluon_data.arrays._blur: the Gaussian blur of ``train`` augmentation in integer arithmetic (a
  C compiler only); without it OpenCV blurs, the same pixels, 1.5-3x slower.

Without what they need the install goes on, pure Python, with a one-line warning per extension.
``GLUON_DATA_BUILD_EXT=0`` skips them; ``GLUON_DATA_BUILD_EXT=1`` requires them (a failed build
fails the install: CI sets it so an extension cannot silently go missing).
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
            self._skip(e, None)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # no jpeglib.h, no libjpeg, a compile error
            self._skip(e, ext.name)

    @staticmethod
    def _skip(e, name):
        if _MODE in ("1", "yes", "true"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        what = _WHAT.get(name, "C extensions")
        sys.stderr.write("WARNING: gluon_data's optional %s %s not built (%s); install %s for "
                         "%s. gluon_data works without %s (%s).\n"
                         % (what[0], "was" if name else "were", first, what[1],
                            "it" if name else "them", "it" if name else "them", what[2]))


#: extension -> (what it is, what it needs, what happens without it)
_WHAT = {
    None: ("C extensions", "a C compiler and libjpeg-turbo headers (libjpeg-dev)",
           "whole-image decodes, numpy mask expansion, histogram pixel statistics, OpenCV's "
           "blur"),
    "gluon_data.format._jpegregion": (
        "JPEG region decoder", "a C compiler and libjpeg-turbo headers (libjpeg-dev)",
        "whole-image decodes"),
    "gluon_data.format._maskrle": ("run-length mask expander", "a C compiler",
                                   "numpy expands the same masks"),
    "gluon_data.convert._moments": ("pixel statistics routine", "a C compiler",
                                    "OpenCV's histograms give the same statistics"),
    "gluon_data.arrays._blur": ("Gaussian blur routine", "a C compiler",
                                "OpenCV blurs, the same pixels"),
}


_SKIP = _MODE in ("0", "no", "false")  # a pure-Python wheel
setup(
    ext_modules=[] if _SKIP else [
        Extension("gluon_data.format._jpegregion", ["gluon_data/format/_jpegregion.c"], libraries=["jpeg"],
                  optional=_MODE not in ("1", "yes", "true")),
        Extension("gluon_data.format._maskrle", ["gluon_data/format/_maskrle.c"],
                  optional=_MODE not in ("1", "yes", "true")),
        Extension("gluon_data.convert._moments", ["gluon_data/convert/_moments.c"],
                  optional=_MODE not in ("1", "yes", "true")),
        Extension("gluon_data.arrays._blur", ["gluon_data/arrays/_blur.c"],
                  optional=_MODE not in ("1", "yes", "true"))],
    cmdclass={"build_ext": OptionalBuildExt},
)
