"""The faithfulness benchmarks: deletion and insertion curves, Chefer et al.'s tests, ROAD, and their runs over image
sets."""
