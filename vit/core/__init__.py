"""The engine's common floor: checkpoints, images and clips in, inference, the registry of families and methods, the
runs folder's files, the commands' shared parser, and small helpers (caches, threads, progress, text)."""
