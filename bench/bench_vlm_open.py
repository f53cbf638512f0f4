"""Opening a vision-language model's folder reads its tower, not its language model (issue 68): the memory and time
of ``open_source`` on a LLaVA-shaped folder whose language model is 16 times its tower, side by side with reading
the whole folder (``read_hf_weights`` without ``wanted``, what any other HF folder gets).

The folder is built once by transformers with random weights, stored in bfloat16 as the Hub's VLMs are (a
ViT-S-sized CLIP tower, 12 layers of which LLaVA reads 11, and a 339 M-parameter Llama: 691 MB of safetensors in
four shards). Each measure runs in a fresh process: the peak rise of the anonymous resident set (RssAnon: the
process's own memory; sampled every 2 ms) and of the whole one (VmRSS: with the file pages it touched) over the call,
after torch's meta kernels are imported (once per process, ~80 MB of Python whatever the model). Run from the
repository root::

    python -m bench.bench_vlm_open --folder /tmp/big-llava

Measured (2026-11-25, 2 shared cores; the tower opened: 21.3 M parameters, 81 MiB in float32):

    | measure                              | anonymous MiB | resident MiB | s   |
    | open_source (the tower, in float32)  |            80 |          124 | 0.3 |
    | read_hf_weights, every tensor        |         1,380 |        1,493 | 2.3 |

The tower's size and no more: each layer's query, key and value are read into the one qkv tensor the model keeps
(``vit.sources.open.joined_slots``); held apart while joined, they cost 18 MiB more (99 MiB, +22 %). Raw rows:
bench/results/cpu-2026-11-25/vlm-open-qkv.txt.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too

TOWER = dict(model_type="clip_vision_model", image_size=224, patch_size=16, hidden_size=384, intermediate_size=1536,
             num_hidden_layers=12, num_attention_heads=6)
TEXT = dict(model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=8, vocab_size=100_000)


def build(folder: Path) -> None:
    """The LLaVA-shaped folder, saved in 200 MB shards (once: an existing folder is kept)."""
    if (folder / "model.safetensors.index.json").is_file():
        return
    import torch
    import transformers

    config = transformers.LlavaConfig(vision_config=TOWER, text_config=TEXT, image_token_id=3)
    model = transformers.LlavaForConditionalGeneration(config).to(torch.bfloat16)  # as the Hub's VLMs are stored
    model.save_pretrained(folder, max_shard_size="200MB")


def measure(folder: str, what: str) -> dict:
    """In this process: the anonymous memory's peak rise and the seconds of opening the tower or reading it all."""
    import threading
    import time

    from vit.sources.open import open_source, read_hf_weights

    def resident_mb() -> tuple[float, float]:
        """(anonymous, all) resident MiB: the process's own memory, and with the file pages it has touched."""
        with open("/proc/self/status") as status:
            values = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status
                      if line.startswith(("RssAnon", "VmRSS"))}
        return values["RssAnon"], values["VmRSS"]

    peak, done = [0.0, 0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[:] = [max(p, now) for p, now in zip(peak, resident_mb(), strict=True)]
            time.sleep(0.002)

    import torch

    torch.cat([torch.empty(1, device="meta")] * 2)  # torch's meta kernels import ~80 MB of Python once: not the model's
    base = resident_mb()
    watcher = threading.Thread(target=watch)
    watcher.start()
    began = time.perf_counter()
    result = open_source(folder) if what == "tower" else read_hf_weights(Path(folder))
    seconds = time.perf_counter() - began
    done.set()
    watcher.join()
    parameters = sum(p.numel() for p in result.model.parameters()) if what == "tower" else None
    return {"what": what, "anonymous_peak_mb": round(peak[0] - base[0]), "resident_peak_mb": round(peak[1] - base[1]),
            "seconds": round(seconds, 2), "parameters": parameters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/bench-vlm-llava", help="where the folder is built (kept)")
    parser.add_argument("--measure", choices=("tower", "all"), help=argparse.SUPPRESS)  # the child's one measure
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.folder, args.measure)))
        return
    build(Path(args.folder))
    for what in ("tower", "all"):
        out = subprocess.run([sys.executable, "-m", "bench.bench_vlm_open", "--folder", args.folder, "--measure",
                              what], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        print(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
