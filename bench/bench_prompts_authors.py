"""The text-prompted maps of a CLIP against their authors' code on the same weights, each timed in its own process.

A random open_clip CLIP with OpenAI's ViT-B/16 image tower (224 px, 197 tokens, quick_gelu) and a small text tower
(one layer of width 64, 16 tokens: the text side is not what is timed) is saved as open_clip saves for the Hub and
opened as the explorer opens it. The work timed is what ``python -m vit.predict --labels ... --save-maps`` does for
each method: the maps of ``--labels`` labels (3 unless told; 1 is what a click in the app asks) for one image
(``prompts.prompt_maps``), against the authors' code doing the same, as tests/test_prompts.py builds it on the same
weights:

- ``rollout-authors``: Chefer et al.'s ``interpret`` (Transformer-MM-Explainability's CLIP notebook, vendored in
  tests/reference/chefer_clip) on its own hooked CLIP: the image repeated once per label, one backward;
- ``legrad-authors``: LeGrad's ``compute_legrad_clip`` with its hooks on the open_clip model (``hook_legrad``), the
  image repeated once per label as its README does;
- ``grad-eclip-authors``: Grad-ECLIP's ``clip_encode_dense`` once, then ``grad_eclip`` per label's cosine
  (tests/reference/grad_eclip), on Chefer's CLIP holding the weights.

``--check`` builds every one in one process and prints the largest absolute difference of each pair of maps
(LeGrad's compared as the authors return it: upsampled to pixels and min-max normalised). Otherwise ``--method``
times one map in this process: one warm-up, then ``--repeats`` maps; it prints the median wall and CPU seconds (the
process's, which other jobs' load does not inflate). Run the pairs in turn, A B A B, from the repository root::

    python bench/bench_prompts_authors.py --check
    python bench/bench_prompts_authors.py --method rollout --threads 1   # in turn with:
    python bench/bench_prompts_authors.py --method rollout-authors --threads 1

Measured 2026-11-23 on the 2-core machine shared with two other workers (load average 4-8), torch 2.14.1 (CPU),
open_clip 3.3.0. ``--check``: rollout 2.3e-10 apart (maps up to 3.3e-4), LeGrad 7.8e-7 (min-max normalised, up to
1), Grad-ECLIP 1.8e-8 (up to 2.8e-2). Timed with ``--threads 1 --repeats 3``, one process each in turn, 3 rounds (the
map alone, median CPU seconds of each process; wall times are not comparable under that load), ours / the authors':

- 3 labels: rollout 0.55-0.62 CPU s against ``interpret``'s 1.54-1.88, 0.34x (0.33-0.36; before this change 1.53-1.63
  CPU s); LeGrad 0.71-0.75 against 1.61-1.84, 0.415x (0.41-0.44; before 1.59-1.70); Grad-ECLIP 0.47-0.51 against
  0.67-0.70, 0.71x (0.66-0.76; before 1.51-1.81, at 2.2-2.7x the authors': the image ran once per label where the
  authors run it once). Grad-ECLIP as whole processes, A B A B, 3 pairs: 0.81x the authors' CPU time, model
  building and imports included;
- 1 label (a click in the app): rollout 0.47-0.60 against 0.56-0.63, 0.85x (0.85-1.01); LeGrad 0.58-0.69 against
  0.65-0.68, 0.95x (0.90-1.01: both are one forward of the image and little else, so parity is the floor);
  Grad-ECLIP 0.47-0.55 against 0.60-0.65, 0.82x (0.74-0.84);
- 8 labels, one round (rollout before its last block ran for CLS alone): rollout 0.83 against 4.34 (0.19x), LeGrad
  1.11 against 4.52 (0.24x), Grad-ECLIP 0.74 against 0.85 (0.87x).

Before, ``prompt_maps`` ran the image once per label (a batch of three); now the image runs once (per 8 labels) and
each label takes a backward that stops inside the model; Grad-ECLIP's and the rollout's last block run for the CLS
token alone (all of it their maps read).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # run as a script; the tests' reference builders
from vit.explain.language import prompts  # noqa: E402
from vit.sources.open import open_source  # noqa: E402
from vit.sources.vlm.text_tower import open_text_tower  # noqa: E402

LABELS = ["a dog", "a cat", "a red ball", "a car", "a tree", "a house", "a bird", "a boat"]  # the first --labels
TEXT_CFG = dict(context_length=16, vocab_size=49408, width=64, heads=1, layers=1)  # the bundled BPE's ids
VISION_CFG = dict(image_size=224, patch_size=16, width=768, layers=12)  # open_clip's ViT-B-16 (12 heads of 64)
METHODS = {"rollout": "rollout", "legrad": "legrad", "grad-eclip": "grad_eclip"}  # bench name -> prompt map key


def save_clip(folder: Path):
    """The random CLIP, saved as open_clip saves for the Hub: (open_clip model, folder)."""
    import open_clip
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    model_cfg = dict(embed_dim=512, quick_gelu=True, text_cfg=TEXT_CFG, vision_cfg=VISION_CFG)
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**model_cfg).eval()
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    return model, folder


def chefer_clip(model):
    """The same weights in the authors' hooked CLIP (as tests/test_prompts.py's ``chefer_clip`` fixture)."""
    from tests.reference.chefer_clip.model import build_model

    state = {k: v.clone() for k, v in model.state_dict().items()}
    reference = build_model(dict(state)).float()  # build_model converts to float16: load float32 again
    reference.load_state_dict(state)
    return reference.eval()


def ours(method: str, folder: Path, labels: list[str]):
    """``image -> (labels, gh, gw)``: our maps of every label, as ``vit.predict --save-maps`` computes them."""
    checkpoint = open_source(folder)
    asked = prompts.ask(open_text_tower(checkpoint), labels, ["{}"])  # the labels as typed, as the authors' texts
    return lambda x: prompts.prompt_maps(checkpoint.model, x, asked, METHODS[method])


def authors(method: str, model, folder: Path, labels: list[str]):
    """``image -> maps``: the authors' maps of every label on ``model``'s weights."""
    import open_clip

    texts = [prompts.fill("{}", label) for label in labels]
    if method == "rollout":
        from tests.reference.chefer_clip.interpret import interpret

        reference, tokens = chefer_clip(model), open_clip.get_tokenizer(f"local-dir:{folder}")(texts)
        return lambda x: interpret(x, tokens, reference, "cpu")[1]  # (labels, patches)
    text = open_text_tower(open_source(folder)).encode(texts)  # normalised, as both authors' scripts use it
    if method == "legrad":
        from test_prompts import hook_legrad

        from tests.reference.legrad import clip_reference as ref

        hooked = copy.deepcopy(model)  # the hooks change the model
        hook_legrad(hooked, ref)
        wrapper = types.SimpleNamespace(visual=hooked.visual, starting_depth=len(hooked.visual.transformer.resblocks)
                                        - 2, patch_size=VISION_CFG["patch_size"], encode_image=hooked.encode_image)
        return lambda x: ref.compute_legrad_clip(wrapper, text, x.repeat(len(labels), 1, 1, 1)).detach()
    from tests.reference.grad_eclip import emap

    emap.clipmodel = chefer_clip(model)

    def run(x):
        with torch.enable_grad():
            outputs, _, _, v, q_out, k_out, _, att_output, map_size = emap.clip_encode_dense(x)
            cosines = (F.normalize(outputs[:, 0], dim=-1) @ text.T)[0]
            return torch.stack([emap.grad_eclip(c, q_out, k_out, v, att_output, map_size) for c in cosines])

    return run


def check(model, folder: Path, x, labels: list[str]) -> None:
    from tests.reference.legrad.clip_reference import min_max

    for method in METHODS:
        mine, theirs = ours(method, folder, labels)(x), authors(method, model, folder, labels)(x)
        if method == "rollout":
            mine = mine.flatten(1)
        if method == "legrad":  # the authors return it upsampled to pixels and min-max normalised
            mine = min_max(F.interpolate(mine[None], scale_factor=VISION_CFG["patch_size"], mode="bilinear"))
        print(f"{method}: max |ours - authors'| = {(mine - theirs).abs().max().item():.2e} "
              f"(maps up to {theirs.abs().max().item():.2e}), shapes {tuple(mine.shape)} {tuple(theirs.shape)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=[m + side for m in METHODS for side in ("", "-authors")])
    p.add_argument("--check", action="store_true", help="print each pair's largest difference and stop")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--labels", type=int, default=3, choices=range(1, len(LABELS) + 1), help="how many labels")
    args = p.parse_args(argv)
    if not args.check and not args.method:
        p.error("give --method or --check")
    torch.set_num_threads(args.threads)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    labels = LABELS[:args.labels]
    with tempfile.TemporaryDirectory() as tmp:
        model, folder = save_clip(Path(tmp) / "clip")
        if args.check:
            check(model, folder, x, labels)
            return 0
        method = args.method.removesuffix("-authors")
        run = (authors(method, model, folder, labels) if args.method.endswith("-authors")
               else ours(method, folder, labels))
        del model  # only what the method holds stays
        run(x)  # warm-up
        times, cpu = [], []
        for _ in range(args.repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            run(x)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    print(f"{args.method}, {len(labels)} label(s), ViT-B/16 at 224 px, {args.threads} thread(s): median "
          f"{statistics.median(times):.3f} s, {statistics.median(cpu):.3f} CPU s over {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
