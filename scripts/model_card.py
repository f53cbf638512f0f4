"""Print the measured facts of a shipped checkpoint as a model-card section (Markdown).

    python scripts/model_card.py checkpoints/cifar10-cifar-s.pt runs/cifar10-cifar-s

Everything printed is read from the checkpoint and its run folder (config.json,
metrics.jsonl, status.json) and from samples/<stem>/samples.json, never typed by hand.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit.checkpoint import load_checkpoint  # noqa: E402
from vit.model import count_parameters  # noqa: E402


def command_of(config: dict) -> str:
    args = config["command"][3:] if config["command"][1:3] == ["-m", "vit.train"] else config["command"][1:]
    return "python -m vit.train " + " ".join(shlex.quote(a) for a in args)


def main() -> int:
    checkpoint_path, run = Path(sys.argv[1]), Path(sys.argv[2])
    checkpoint = load_checkpoint(checkpoint_path)
    meta, config = checkpoint.metadata, json.loads((run / "config.json").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    best = max(metrics, key=lambda m: m["val_acc"])
    c = checkpoint.config
    pre = checkpoint.preprocessing
    seconds = sum(m["epoch_seconds"] for m in metrics)
    rate = sorted(m["images_per_second"] for m in metrics)[len(metrics) // 2]
    print(f"| preset | `{meta.get('preset')}`: {c.image_size} px, {c.num_channels} channel(s), patch {c.patch_size}, "
          f"hidden {c.hidden_size}, {c.num_layers} layers, {c.num_heads} heads, MLP {c.mlp_size} |")
    print(f"| parameters | {count_parameters(checkpoint.model):,} |")
    print(f"| data | `{meta['dataset']}`: {meta['train_size']:,} training / {meta['val_size']:,} validation images "
          f"(stratified, seed {config['args']['seed']}) |")
    print(f"| preprocessing | resize to {pre.image_size}x{pre.image_size}, mean {list(pre.mean)}, "
          f"std {list(pre.std)} |")
    a = config["args"]
    print(f"| recipe | `{a['recipe']}`: AdamW lr {a['lr']:g}, wd {a['weight_decay']:g}, batch {a['batch_size']}, "
          f"warmup {a['warmup_epochs']:g} epochs, {a['schedule']} schedule, label smoothing "
          f"{a['label_smoothing']:g}, augmentation `{a['augment']}` |")
    print(f"| epochs | {meta['epochs']} (best validation at epoch {best['epoch']}) |")
    print(f"| wall time | {seconds / 60:.1f} min for all {len(metrics)} epochs of the run (sum of "
          f"`epoch_seconds`); median {rate:.0f} training images/s |")
    print(f"| hardware | {meta.get('hardware')} |")
    print(f"| validation accuracy | **{100 * meta['val_acc']:.2f} %** (this file's epoch); best seen "
          f"{100 * best['val_acc']:.2f} % |")
    print(f"| reproduce | `{command_of(config)}` |")
    samples = checkpoint_path.parent / "samples" / checkpoint_path.stem / "samples.json"
    if samples.exists():
        print("\nSample images (from the training split) and what this checkpoint predicts:\n")
        print("| file | true label | predicted | probability |\n| --- | --- | --- | --- |")
        for r in json.loads(samples.read_text()):
            print(f"| `samples/{checkpoint_path.stem}/{r['file']}` | {r['label']} | {r['predicted']} | "
                  f"{r['probability']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
