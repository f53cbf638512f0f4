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
  (tests/reference/grad_eclip), on Chefer's CLIP holding the weights;
- the training-free dense maps, built by tests/test_dense_clip.py's own builders (imported): ``maskclip-authors``,
  MaskCLIP's mmseg ``VisionTransformer.forward`` and ``MaskClipHead.forward`` on open_clip's modules (the head's
  maps on the patch grid); ``sclip-authors``, ``naclip-authors``, ``clearclip-authors``, each segmentor's
  ``forward_feature`` (which ends in a bilinear resize to the input: ours are compared through the same resize, and
  timed without it); ``clipsurgery-authors``, CLIP Surgery's ``encode_image`` and ``clip_feature_surgery`` (one label
  weighed against the empty text, as its demo).

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

The dense maps, measured 2026-11-27 on the same machine (2 cores shared; load average 4.0-4.6 in rounds 1-2, 6.6-15
in round 3), torch 2.15.0 (CPU), open_clip 3.3.0. ``--check``, 3 labels (1 label alike): SCLIP 1.0e-7 apart (maps up
to 0.11), NACLIP 1.8e-7 (up to 0.10), ClearCLIP 1.5e-7 (up to 0.074), MaskCLIP 1.5e-7 (up to 0.12), CLIP Surgery
4.8e-8 (up to 0.047; 1 label, against the empty text: 5.0e-8), all inside the tests' 1e-5; rollout, LeGrad and
Grad-ECLIP on this torch: 3.1e-10, 1.2e-6, 3.2e-8. Each is one forward of the image with its last block(s) changed
and no backward, so the labels barely count and parity is the floor. Timed as above (``--threads 1 --repeats 3``,
3 rounds, median CPU seconds of each process, ours / the authors', the median of the rounds' ratios):

- 3 labels: MaskCLIP 0.30-0.34 CPU s against 0.36-0.55, 0.82x (0.63-0.92: the authors' last layer runs its
  attention and MLP, whose output the head drops, beside the value path); SCLIP 0.32-0.37 against 0.32-0.36, 1.00x
  (0.98-1.04); NACLIP 0.30-0.37 against 0.31-0.35, 0.97x (0.96-1.20); ClearCLIP 0.32-0.36 against 0.34-0.39, 0.94x
  (0.91-1.06); CLIP Surgery 0.37-0.43 against 0.33-0.40, 1.08x (1.07-1.12): slower than the authors', in all three
  rounds. Each of its last six blocks runs the surgery branch as a block of its own beside the model's, so that
  block's first norm and q, k, v projection are computed twice; the authors' ``Attention`` computes q, k, v once for
  both paths (six extra projections: about an eighth of the forward's FLOPs). Since 2026-11-29 they are formed once
  (``dense_clip.qkv_once``; its norm still runs twice): 1.07x and 1.08x in two rounds at load 9-20, the code before
  1.14x and 1.35x in the same rounds (bench/results/cpu-2026-11-29/clip-surgery-qkv-once.txt);
- 1 label: MaskCLIP 0.30-0.36 against 0.33-0.41, 0.89x (0.89-0.95); SCLIP 0.30-0.36 against 0.31-0.39, 0.95x
  (0.92-0.96); NACLIP 0.30-0.49 against 0.32-0.36, 1.03x (0.96-1.49, the 1.49 at load 15); ClearCLIP 0.30-0.40
  against 0.32-0.47, 0.95x (0.71-1.02); CLIP Surgery 0.38-0.44 against 0.36-0.52, 0.90x (0.84-1.06).

The authors' MaskCLIP is built per call by the test's ``maskclip_reference`` (its 1x1-conv projection among it,
about 3 ms of the authors' time); the segmentors' resize to 224 px is in theirs, not ours (``--save-maps`` draws the
overlay later, untimed here).
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
from vit.explain.methods import dense_clip  # noqa: E402
from vit.sources.open import open_source  # noqa: E402
from vit.sources.vlm.text_tower import open_text_tower  # noqa: E402

LABELS = ["a dog", "a cat", "a red ball", "a car", "a tree", "a house", "a bird", "a boat"]  # the first --labels
TEXT_CFG = dict(context_length=16, vocab_size=49408, width=64, heads=1, layers=1)  # the bundled BPE's ids
VISION_CFG = dict(image_size=224, patch_size=16, width=768, layers=12)  # open_clip's ViT-B-16 (12 heads of 64)
MODEL_CFG = dict(embed_dim=512, quick_gelu=True, text_cfg=TEXT_CFG, vision_cfg=VISION_CFG)
METHODS = {"rollout": "rollout", "legrad": "legrad", "grad-eclip": "grad_eclip",  # bench name -> prompt map key
           **{key: key for key in dense_clip.METHODS}}  # SCLIP, NACLIP, ClearCLIP, MaskCLIP, CLIP Surgery
UPSAMPLED = ("sclip", "naclip", "clearclip")  # the segmentors' forward_feature ends in a bilinear resize to the input


def save_clip(folder: Path):
    """The random CLIP, saved as open_clip saves for the Hub: (open_clip model, folder)."""
    import open_clip
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = open_clip.model.CLIP(**MODEL_CFG).eval()
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    save_config_for_hf(model, folder / "open_clip_config.json", model_config=MODEL_CFG)
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


def dense_authors(method: str, model, text: torch.Tensor, blank: torch.Tensor | None):
    """``image -> maps``: the authors' segmentor (CLIP Surgery: its demo) on ``model``'s weights, built as
    tests/test_dense_clip.py builds it; ``text`` (n, E) the labels' normalised embeddings, ``blank`` (E,) the empty
    text's (CLIP Surgery with one label). The segmentors' maps at the input's size, MaskCLIP's head's and CLIP
    Surgery's on the patch grid: ``(n, H, W)`` or ``(n, gh, gw)``."""
    import test_dense_clip as dense

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if method == "maskclip":  # mmseg's VisionTransformer.forward and MaskClipHead.forward on open_clip's modules
        visual = dense.open_clip_visual(state, MODEL_CFG)
        return lambda x: dense.maskclip_reference(visual, text, x)[0]
    if method == "clipsurgery":
        from tests.reference.clip_surgery.feature_surgery import clip_feature_surgery

        net = dense.surgery_reference(state, MODEL_CFG)

        def surgery(x):
            with torch.no_grad():
                features = net.encode_image(x)
                features = features / features.norm(dim=-1, keepdim=True)  # the demo's next line
                similarity = clip_feature_surgery(features, text, None if blank is None else blank[None])  # (1, T, n)
            grid = x.shape[2] // VISION_CFG["patch_size"], x.shape[3] // VISION_CFG["patch_size"]
            return similarity[0, 1:].T.reshape(len(text), *grid)  # get_similarity_map's reshape

        return surgery
    from tests.reference.clearclip.clearclip_segmentor import ClearCLIPSegmentation
    from tests.reference.naclip.naclip import NACLIP
    from tests.reference.sclip.clip_segmentor import CLIPForSegmentation

    if method == "sclip":
        segmentor, forward = dense.sclip_segmentor(state, text), CLIPForSegmentation.forward_feature
    elif method == "naclip":
        segmentor, forward = dense.naclip_segmentor(state, text), NACLIP.forward_feature
    else:
        segmentor, forward = dense.clearclip_segmentor(state, MODEL_CFG, text), ClearCLIPSegmentation.forward_feature

    def run(x):
        with torch.no_grad():
            return forward(segmentor, x)[0]  # (n, H, W)

    return run


def authors(method: str, model, folder: Path, labels: list[str]):
    """``image -> maps``: the authors' maps of every label on ``model``'s weights."""
    import open_clip

    texts = [prompts.fill("{}", label) for label in labels]
    if method == "rollout":
        from tests.reference.chefer_clip.interpret import interpret

        reference, tokens = chefer_clip(model), open_clip.get_tokenizer(f"local-dir:{folder}")(texts)
        return lambda x: interpret(x, tokens, reference, "cpu")[1]  # (labels, patches)
    tower = open_text_tower(open_source(folder))
    text = tower.encode(texts)  # normalised, as every authors' script uses it
    if method in dense_clip.METHODS:
        # one label: CLIP Surgery's demo weighs it against the empty text in the template
        blank = tower.encode([prompts.fill("{}", "")])[0] if method == "clipsurgery" and len(labels) == 1 else None
        return dense_authors(method, model, text, blank)
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
        if method in UPSAMPLED:  # as the tests compare them: through the segmentors' own resize
            mine = F.interpolate(mine[None], size=x.shape[-2:], mode="bilinear")[0]
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
