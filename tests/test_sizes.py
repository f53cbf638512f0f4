"""Every caption writes sizes one way (issue 45, item 10): pixels width × height, patch grids rows × columns, each
labelled (a caption read '32×20 px in 5×8 patches', the grid in the other order)."""

from vit.core.sizes import describe_size


def test_pixels_are_width_by_height():
    assert describe_size(32, 20) == "32×20 px"


def test_a_grid_is_rows_by_columns_and_says_so():
    assert describe_size(32, 20, (5, 8), 4) == "32×20 px in 5 rows × 8 columns of 4-px patches"
    assert describe_size(2048, 16, (1, 128)) == "2048×16 px in 1 row × 128 columns of patches"
