"""Decoding a video clip to a video model's frames (issue 65, item 1: "a 10-s 1080p MP4 to 16 frames in under 1 s on
2 cores"): ``python bench/bench_video_decode.py [--seconds 10] [--frames 16] [--repeats 3]``.

The bench writes its own clip with PyAV (not committed): ``--seconds`` of 1080p at 30 fps, H.264 (libx264, preset
medium, CRF 23, yuv420p), a textured scene panning under noise so the encoder has real motion to code, once with
x264's default keyframe interval (250 frames) and once with a keyframe a second (30: phones and streaming). It then
times, side by side on the same file, ``--frames`` frames sampled uniformly (transformers' ``sample_frames``):

- naive: PyAV's loop over every frame, each converted to RGB (``frame.to_image()``), the sampled ones kept;
- sequential: every frame decoded (frame threads), only the sampled ones converted to RGB;
- ours: ``vit.core.clips.read_clip``: the packets' timestamps demuxed and the frames nothing refers to named from their
  headers (FFmpeg's ``filter_units``), then the keyframe intervals holding sampled frames dealt to one decoder a core,
  each seeking to the keyframe before a sampled frame when it lies past what it has decoded and decoding forward
  otherwise, never sent an unreferenced frame unless sampled, only the sampled frames converted.

Each is the median of ``--repeats`` runs, pinned to 2 cores, in wall-clock seconds and in CPU seconds (every thread
of the process: what a busy machine inflates less); ours' frames are checked equal to the naive loop's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WIDTH, HEIGHT, RATE = 1920, 1080, 30


def write_clip(path: Path, seconds: float, gop: int | None) -> Path:
    """A 1080p30 H.264 MP4: a fixed texture panning right and down, with fresh noise on every frame."""
    import av

    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (HEIGHT // 8 + 64, WIDTH // 8 + 64, 3), dtype=np.uint8)
    texture = np.kron(texture, np.ones((8, 8, 1), dtype=np.uint8))  # 8-px blocks: edges to code, not only noise
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=RATE, options={"preset": "medium", "crf": "23"})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        if gop:
            stream.codec_context.gop_size = gop
        for i in range(int(seconds * RATE)):
            frame = texture[2 * i:2 * i + HEIGHT, 3 * i:3 * i + WIDTH]
            frame = np.clip(frame.astype(np.int16) + rng.integers(-12, 13, frame.shape, dtype=np.int16), 0, 255)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame.astype(np.uint8), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def naive(path: Path, indices: list[int]) -> list[np.ndarray]:
    import av

    wanted, kept = set(indices), {}
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            image = frame.to_image()
            if i in wanted:
                kept[i] = image
    return [np.asarray(kept[i]) for i in indices]


def sequential(path: Path, indices: list[int]) -> list[np.ndarray]:
    import av

    wanted, kept = set(indices), {}
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for i, frame in enumerate(container.decode(stream)):
            if i in wanted:
                kept[i] = frame.to_image()
            if i >= max(indices):
                break
    return [np.asarray(kept[i]) for i in indices]


def ours(path: Path, indices: list[int]) -> list[np.ndarray]:
    from vit.core.clips import read_clip

    sampled = read_clip(path, len(indices))
    assert sampled.indices == indices
    return [np.asarray(f) for f in sampled.frames]


def timed(function, *args, repeats: int) -> tuple[float, float, list[np.ndarray]]:
    """The median wall-clock seconds and CPU seconds (every thread of this process) of ``repeats`` calls."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        out = function(*args)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    import av

    from vit.core.clips import sample_indices

    total = int(args.seconds * RATE)
    indices = sample_indices(total, args.frames)
    print(f"# {args.seconds:g} s of {WIDTH}x{HEIGHT} at {RATE} fps ({total} frames), H.264 (libx264 medium, CRF 23) "
          f"in MP4, to {args.frames} uniformly sampled frames; PyAV {av.__version__}, "
          f"{len(os.sched_getaffinity(0))} cores, median of {args.repeats}; load average at the start "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| keyframe interval | file MB | naive s (CPU s) | sequential s (CPU s) | ours s (CPU s) | naive / ours "
          "| sequential / ours |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for gop in (None, RATE):
            path = write_clip(Path(folder) / f"clip-{gop}.mp4", args.seconds, gop)
            t_naive, c_naive, reference = timed(naive, path, indices, repeats=args.repeats)
            t_sequential, c_sequential, frames = timed(sequential, path, indices, repeats=args.repeats)
            assert all((a == b).all() for a, b in zip(frames, reference, strict=True))
            t_ours, c_ours, frames = timed(ours, path, indices, repeats=args.repeats)
            assert all((a == b).all() for a, b in zip(frames, reference, strict=True)), "ours differ from naive"
            label = "250 (x264 default)" if gop is None else f"{gop} (1 s)"
            print(f"| {label} | {path.stat().st_size / 2**20:.1f} | {t_naive:.2f} ({c_naive:.2f}) | "
                  f"{t_sequential:.2f} ({c_sequential:.2f}) | {t_ours:.2f} ({c_ours:.2f}) | {t_naive / t_ours:.1f} | "
                  f"{t_sequential / t_ours:.1f} |", flush=True)
    print(f"\nours' frames equal the naive loop's at the sampled indices, pixel for pixel; load average at the end "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
