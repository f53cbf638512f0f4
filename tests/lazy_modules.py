"""A test module's optional library, imported when a test first reads it rather than while the suite is collected.

``pytest.importorskip("av")`` at a module's top imports the library in every xdist worker while it collects the
whole suite, though one worker runs that module's tests: ~0.5-1 s of CPU a library a worker (captum, h5py, PyAV,
nbformat, OpenCV; issue 112, item 2). ``lazy("av")`` skips the module as importorskip does where the library is not
installed (its spec is looked up, nothing imported) and returns a module that imports it on its first attribute.
"""

from __future__ import annotations

import importlib
import importlib.util
import types

import pytest


class _Lazy(types.ModuleType):
    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # pytest's probes while it collects (``__test__``, a fixture's marker)
            raise AttributeError(attribute)
        try:
            module = importlib.import_module(self.__name__)
        except ImportError as e:  # installed but broken (a PyAV built against a missing libav): skipped, as before
            pytest.skip(f"could not import {self.__name__!r}: {e}")
        self.__dict__.update(vars(module))  # later reads are plain lookups
        return getattr(module, attribute)

    def __setattr__(self, attribute: str, value) -> None:  # monkeypatch.setattr(av, "open", ...): the module's own
        setattr(importlib.import_module(self.__name__), attribute, value)
        super().__setattr__(attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(importlib.import_module(self.__name__), attribute)
        self.__dict__.pop(attribute, None)


def installed(name: str) -> bool:
    """Whether ``name`` (a dotted name: its top package's spec) is installed, without importing it."""
    return importlib.util.find_spec(name.partition(".")[0]) is not None


def lazy(name: str) -> types.ModuleType:
    """``name``, imported on its first attribute; the calling test module skipped where it is not installed."""
    if not installed(name):
        pytest.skip(f"could not import {name!r}: not installed", allow_module_level=True)
    return _Lazy(name)
