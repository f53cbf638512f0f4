"""Which step of a VLM's answer sets its memory peak (issue 92's speed criterion; bench_vlm_answer.py measures the
peak, this names the step): one side of bench_vlm_answer (``theirs``: transformers' eager ``generate(output_attentions
=True)``; ``ours``: ``vit.ask_vlm`` and the last token's attention map) on a folder bench_vlm_answer built, in this
process, after the same copy of the weights into memory and warm-up, with every module's forward entry and exit an
event. At each event the resident set's high-water mark since the previous event is read (VmHWM) and reset
(/proc/self/clear_refs), so each peak is the peak between two events: the steps are ranked by it, over the resident
set once the model is open, with what is resident after each step, anonymous (tensors) and file-backed (mapped
pages).

``--alone NAME`` then runs module NAME again on the input it was handed in the answer (kept by a hook: counted in
the peaks after it), three ways, each peak over the resident set before it: as handed, on a contiguous copy of its
input, and with oneDNN off (``torch.backends.mkldnn``), with the largest difference from the output as handed. Run
it as bench_vlm_answer runs a side (one thread, glibc handing freed blocks back: tests/peak_memory.py's environment),
from the repository root::

    OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=65536 VIT_ANALYSIS_MEMORY_MB=1000000 \\
        python -m bench.bench_vlm_peak_steps theirs /tmp/fam/glm4v --side 448 --alone model.visual.downsample
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # peak_memory

MB = 2**20


def status() -> dict[str, int]:
    """The resident set's high-water mark, size, and its anonymous and file-backed parts, in bytes."""
    with open("/proc/self/status") as f:
        text = f.read()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) * 1024
            for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}


class Steps:
    """The events of an answer and each one's peak since the one before."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, int]]] = []  # (previous event, this event, status)
        self.armed, self.previous = False, "start"
        self.inputs: dict[str, tuple] = {}  # a module's last positional input, for --alone

    def mark(self, label: str) -> None:
        if not self.armed:
            return
        self.events.append((self.previous, label, status()))
        self.previous = label
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def hook(self, model, keep: str | None) -> None:
        """An event at each module's forward entry and exit; ``keep``'s input kept."""
        for name, module in model.named_modules():
            name = name or "<model>"

            def enter(_module, args, name=name):
                if name == keep:
                    self.inputs[name] = args
                self.mark(f"enter {name}")

            module.register_forward_pre_hook(enter)
            module.register_forward_hook(lambda _m, _a, _o, name=name: self.mark(f"exit {name}"))


def answer(side: str, folder: Path, px: int, steps: Steps, keep: str | None):
    """``side``'s answer to bench_vlm_answer's question about its random ``px`` image, after its warm-up, the events
    armed; the model."""
    import torch

    from bench.bench_vlm_answer import QUESTION, WARM_SIDE, picture, weights_in_memory
    from tests.peak_memory import start

    if side == "theirs":
        import json

        import transformers

        architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
        model = getattr(transformers, architecture).from_pretrained(
            folder, attn_implementation="eager", dtype="auto").eval()
        processor = transformers.AutoProcessor.from_pretrained(folder)

        def ask(image, n):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
            text = processor.apply_chat_template(messages, add_generation_prompt=True)
            steps.mark("processor")
            inputs = processor(images=[image], text=text, return_tensors="pt").to(dtype=model.dtype)
            steps.mark("generate")
            with torch.no_grad():
                model.generate(**inputs, max_new_tokens=n, do_sample=False, output_attentions=True,
                               return_dict_in_generate=True)
            steps.mark("generate's end")
    else:
        import vit

        vlm = vit.open_vlm(folder)
        model = vlm.model

        def ask(image, n):
            steps.mark("ask_vlm")
            reply = vit.ask_vlm(vlm, image, QUESTION, max_new_tokens=n)
            steps.mark("ask_vlm's end")
            reply.attention(len(reply.tokens) - 1, -1)
            steps.mark("attention map's end")

    weights_in_memory(model)
    ask(picture(WARM_SIDE), 2)
    steps.hook(model, keep)
    image = picture(px)
    base, before = start(), status()
    steps.armed = True
    ask(image, 16)
    steps.armed = False
    return model, base, before


def alone(model, name: str, args: tuple) -> list[str]:
    """Module ``name`` run again on ``args``: as handed, on contiguous inputs, with oneDNN off; each one's peak."""
    import torch

    from tests.peak_memory import peak, start

    module = model.get_submodule(name)
    contiguous = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
    lines = [f"{name} alone ({type(module).__name__}; input "
             f"{', '.join(f'{tuple(a.shape)} contiguous {a.is_contiguous()}' for a in args if torch.is_tensor(a))})"]
    with torch.no_grad():
        reference = module(*args)
        for label, inputs, onednn in (("as handed", args, True), ("its input contiguous", contiguous, True),
                                      ("oneDNN off", args, False)):
            torch.backends.mkldnn.enabled = onednn
            module(*inputs)  # a first call, as the warm-up's
            base = start()
            out = module(*inputs)
            lines.append(f"  {label}: peak {(peak() - base) / MB:,.1f} MB over the resident set before it; largest "
                         f"difference from the output as handed {(out - reference).abs().max().item():.2e}")
        torch.backends.mkldnn.enabled = True
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=("theirs", "ours"))
    parser.add_argument("folder", type=Path, help="a folder bench_vlm_answer built (--folder)")
    parser.add_argument("--side", dest="px", type=int, default=448, help="the image's side, px")
    parser.add_argument("--top", type=int, default=8, help="how many steps to list")
    parser.add_argument("--alone", help="a module's name: run it again alone, three ways")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    steps = Steps()
    model, base, before = answer(args.side, args.folder, args.px, steps, args.alone)
    top = max(s["VmHWM"] for _, _, s in steps.events)
    print(f"# python -m bench.bench_vlm_peak_steps {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# {args.side}: resident once the model is open {base / MB:,.0f} MB (anonymous "
          f"{before['RssAnon'] / MB:,.0f}, file-backed {before['RssFile'] / MB:,.0f}); {len(steps.events)} events; "
          f"the answer's peak {(top - base) / MB:,.1f} MB over it")
    for previous, label, s in sorted(steps.events, key=lambda e: -e[2]["VmHWM"])[:args.top]:
        print(f"{(s['VmHWM'] - base) / MB:8.1f} MB between [{previous}] and [{label}] (then "
              f"{(s['VmRSS'] - base) / MB:+.1f} MB resident: anonymous {(s['RssAnon'] - before['RssAnon']) / MB:+.1f}, "
              f"file-backed {(s['RssFile'] - before['RssFile']) / MB:+.1f})")
    if args.alone:
        if args.alone not in steps.inputs:
            raise SystemExit(f"{args.alone} did not run in the answer")
        print("\n".join(alone(model, args.alone, steps.inputs.pop(args.alone))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
