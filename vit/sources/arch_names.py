"""``--arch LIB:NAME``, the architecture of a bare weights file, checked from the text alone: no torch, so a command
refuses a mistyped one at once, before it loads anything (``vit.sources.open`` builds the architecture it names)."""

from __future__ import annotations

ARCH_LIBRARIES = ("timm", "torchvision", "dinov3", "open_clip", "scratch", "vit_pytorch")


def arch_problem(arch: str | None) -> str | None:
    """The one line that refuses ``arch``, or None for no ``--arch`` and for ``LIB:NAME`` with a library we read."""
    if not arch:
        return None
    library, _, name = arch.partition(":")
    if library in ARCH_LIBRARIES and name:
        return None
    return (f"--arch {arch!r} must be timm:NAME, torchvision:NAME, dinov3:NAME, open_clip:quickgelu|gelu, "
            "scratch:key=value,... or vit_pytorch:key=value,... (e.g. timm:vit_base_patch16_224, dinov3:vitl16, "
            "scratch:num_heads=8, vit_pytorch:heads=8)")


def check_arch(arch: str | None) -> None:
    """A command's check of its ``--arch`` before torch loads: UsageError (its one line) for a spec we do not read."""
    from vit.core.cli import UsageError

    if problem := arch_problem(arch):
        raise UsageError(problem)
