"""How every caption writes a size: pixels as width × height, a patch grid as rows × columns, each labelled, so
that '32×20 px' beside a grid of 5 rows and 8 columns cannot be read as a 5-wide, 8-high one."""

from __future__ import annotations


def describe_size(width: int, height: int, grid: tuple[int, int] | None = None, patch: int | None = None) -> str:
    """'32×20 px'; with its patch ``grid`` ``(rows, columns)`` (and ``patch`` side),
    '32×20 px in 5 rows × 8 columns of 4-px patches'."""
    text = f"{width}×{height} px"
    if grid is None:
        return text
    rows, columns = grid
    patches = f"{patch}-px patches" if patch is not None else "patches"
    return (f"{text} in {rows:,} row{'s' if rows != 1 else ''} × {columns:,} column{'s' if columns != 1 else ''} "
            f"of {patches}")
