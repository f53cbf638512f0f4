"""ViT Attention Explorer's engine. In a notebook: ``import vit``, then

    checkpoint = vit.load("google/vit-base-patch16-224")  # a path, a folder, an HF-cache name or a Hub id
    vit.explain(checkpoint, "photo.jpg", "rollout")       # an Explanation: .map, .overlay(), .figure()
    vit.methods(checkpoint)                               # the maps this model gets (no argument: every map)
    vit.ask(clip, "photo.jpg", ["a dog", "a cat"])        # CLIP / SigLIP zero-shot scores and maps
    vit.explore(model, image_size=224)                    # the explorer page on a model in hand

``import vit`` imports nothing else: these names load ``vit.api`` (which uses the explorer's own functions) when
first used, so the core and the commands never pay for it. ``vit.explain`` stays the ``vit.explain`` package for
imports (``from vit.explain.methods.attention import rollout``) and is ``vit.api.explain`` when called.
"""

import atexit
import ctypes
import gc
import importlib
import os
import sys
import types

# glibc's M_MMAP_THRESHOLD (mallopt's -3): blocks at least this large are mapped on their own and given back when freed
MMAP_THRESHOLD = 4 * 2**20


def _give_back_freed_blocks() -> None:
    """Fix glibc malloc's mmap threshold at ``MMAP_THRESHOLD``. By default glibc raises the threshold to the size of
    each large block freed (up to 32 MB), so a view's freed attention stays in the heap and the next view's grows it:
    the same Swin analysis and maps measured 386-467 MB of peak RSS from run to run, past the memory bound its
    estimate keeps (issue 62). Fixed, every block over 4 MB goes back to the system when freed (328 MB, every run).
    Left alone where the user set ``MALLOC_MMAP_THRESHOLD_`` or the C library is not glibc."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


_give_back_freed_blocks()


def _nanobind_loaded() -> bool:
    """Whether an extension module built with nanobind is loaded (triton is: the CUDA torch wheels bring it, and
    torchvision imports it). Its leak check at the interpreter's very end reports every one of its objects still
    alive, in 27-31 lines on stderr."""
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not names or not str(getattr(module, "__file__", "")).endswith((".so", ".pyd")):
            continue
        for value in list(names.values()):
            if type(value).__module__ == "nanobind" or type(type(value)).__module__ == "nanobind":
                return True
    return False


def _freeze_at_exit() -> None:
    """At exit, Python's last garbage collections walk every object still alive: with torch and torchvision loaded
    that is ~330,000 objects and 1.3 s of CPU on two cores. Frozen first (atexit runs before those collections),
    they are skipped: ~0.2 s. Not with nanobind loaded: the objects a freeze keeps alive are what its leak check
    reports, so such a process exits as Python does; the commands exit through ``vit.core.cli.finish``, which is fast
    and silent either way."""
    if not _nanobind_loaded():
        gc.freeze()


atexit.register(_freeze_at_exit)

API = ("load", "explain", "methods", "shipped", "samples", "ask", "ask_methods", "mechanism", "head_effects",
       "ablate", "reference_means", "patching", "registers", "sinks", "Explanation", "feature_attribution",
       "Answer", "pca", "similarity", "correspondences", "PCA", "Similarity",
       "Correspondences", "visual_logit_lens", "explain_word",
       "WordMap", "textspan", "TextSpan", "open_vlm", "ask_vlm", "VLMAnswer", "segment",
       "Segmentation", "open_sam3", "ConceptSegmentation",
       "explore")  # no name of a module: vit.predict is the command


def __getattr__(name: str):
    if name == "__version__":  # read when first asked: import vit reads no file
        from vit.core.version import project_version

        globals()["__version__"] = version = project_version()
        return version
    if name in API:
        from vit import api

        return getattr(api, name)
    raise AttributeError(f"module 'vit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API) | {"__version__"})


class _Explain:
    """``vit.explain(checkpoint, image, method="rollout", ...)``: see ``vit.api.explain``. As a package
    (``vit.explain.methods.attention``), the ``vit.explain`` wing."""

    def __call__(self, *args, **kwargs):
        from vit import api

        return api.explain(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        package = importlib.import_module("vit.explain")
        try:
            return getattr(package, name)
        except AttributeError:
            try:
                return importlib.import_module(f"vit.explain.{name}")  # a submodule not imported yet
            except ModuleNotFoundError:
                raise AttributeError(f"module 'vit.explain' has no attribute {name!r}") from None

    @property
    def __signature__(self):
        import inspect

        from vit import api

        return inspect.signature(api.explain)

    def __repr__(self) -> str:
        return "<function vit.explain(checkpoint, image, method='rollout', ...) and package vit.explain>"


class _Package(types.ModuleType):
    """The ``vit`` module's type: its ``explain`` attribute is ``_Explain`` whatever the import system sets there
    when it loads the ``vit.explain`` package (it does, as for every subpackage)."""

    explain = property(lambda self: _EXPLAIN, lambda self, package: None)


_EXPLAIN = _Explain()
sys.modules[__name__].__class__ = _Package
