"""How every caption writes a size: pixels as width × height, a patch grid as rows × columns, each labelled, so
that '32×20 px' beside a grid of 5 rows and 8 columns cannot be read as a 5-wide, 8-high one."""

from __future__ import annotations


def describe_size(width: int, height: int, grid: tuple[int, int] | None = None,
                  patch: int | tuple[int, int] | None = None) -> str:
    """'32×20 px'; with its patch ``grid`` ``(rows, columns)`` (and ``patch``: a side, or ``(height, width)``),
    '32×20 px in 5 rows × 8 columns of 4-px patches' ('of 8×2-px patches' for a rectangular one, width first)."""
    text = f"{width}×{height} px"
    if grid is None:
        return text
    rows, columns = grid
    if isinstance(patch, tuple | list):
        ph, pw = patch
        patch = ph if ph == pw else f"{pw}×{ph}"
    patches = f"{patch}-px patches" if patch is not None else "patches"
    return (f"{text} in {rows:,} row{'s' if rows != 1 else ''} × {columns:,} column{'s' if columns != 1 else ''} "
            f"of {patches}")
