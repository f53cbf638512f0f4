"""Time of the mechanism grids for one image, as ratios to one plain forward pass run side by side.

The ablation grid (each head alone ablated: one pass of the remaining layers per layer, heads batched), the
head patching grid (the same shape of work on a corrupted image) and the residual patching grid (every layer x
token position: the remaining layers run once per position, in chunks), plus direct logit attribution and
the logit lens. Model: a random ViT-B/16 at 224 px (our ``vit-base-16`` preset). Calls alternate with the
baseline so that background load slows all alike; the table shows medians. Run from the repository root::

    python -m bench.bench_mechanism --threads 2

Measured 2026-11-22 on this project's 2-core CPU machine (shared with other jobs, torch 2.14, 2 threads), one
224-px image: forward 0.45 s, logit lens 0.23 s, direct logit attribution 0.29 s, ablation grid 16.9 s, head
patching grid 29.2 s, residual patching grid (12 layers x 197 positions) 296 s (one run). Later, with the
machine idle (3 runs each): forward 0.145 s, logit lens 0.167 s, attribution 0.183 s, ablation grid 9.2 s (63x);
the grids scale with L x H (or L x T) passes of the remaining layers, about L x H x (L + 1) / 2 / L forwards.
2026-11-23, the same machine (slower that day: forward 0.295 s): logit lens 0.368 s, attribution 0.410 s, ablation
grid 18.7 s (63x), head patching grid 18.8 s (64x), residual patching grid 378 s (1284x, one run), mean contexts of
8 reference images 1.88 s, a mean-ablated copy with one head off 0.013 s (its parameters shared with the model;
a whole deep copy took 0.10 s).
2026-11-23, the grids on the model's hook points (``ViT.run_blocks`` + ``attn.hook_z``) against the loop they
replace (the previous checkout, ``PYTHONPATH=<it>``), ``--size 112 --only "ablation grid,head patching"``, two runs
of each in turn on the same machine under heavy load from other jobs (forward 0.9-2.0 s): ablation grid 24.9 / 27.7 s
before, 19.2 / 33.8 s after; head patching 29.8 / 38.3 s before, 26.5 / 33.5 s after; residual patching (12 layers
x 50 positions) 93.0 / 78.9 s before, 94.4 / 95.8 s after: the same within the noise. Both put the interventions in
the batch dimension (a layer's heads, or a chunk of positions, per pass of the remaining layers), so batching gives
no further factor: the residual grid's work is L x T passes of the remaining layers (1,280 forwards' worth at 224 px,
and the old loop took 1,284 forwards' time). Exact savings left are small (the last block's unread rows, rows equal
in both runs). 2026-11-23, later: the grids batch each layer's B x T (or B x H) interventions across images, ``chunk``
at a time, and the last block computes only the tokens the head reads (``run_blocks(queries=)``). ``--size 112 --only
none --residual-repeats 2``, CPU seconds (the machine under a load of 5-25), one turn each before a time limit: batched
grid 58.7 and 38.1 CPU s against the loop before 59.6 and 44.1 (1.02x and 1.16x). The torch-hook loop (one whole forward
per cell) did not finish a turn within the limit either time. 2026-11-23, evening, ViT-B/16 at 224 px (12 layers x 197
positions), one thread, the process's CPU seconds, the machine under a load of 4-9: ``--threads 1 --prisma --only none
--residual-repeats 1 --residual-only batched,before,prisma`` gave the batched grid 597.1 CPU s and the per-layer loop
before it 694.4 (1.16x; the run was stopped before its full ViT-Prisma turn); ``--prisma --prisma-layers 1
--residual-only prisma`` timed ViT-Prisma's ``run_with_hooks`` loop (what TransformerLens's ``get_act_patch_resid_pre``
does) over layer 0's 197 cells, 135.7 CPU s, so 1,628.7 for the grid: 2.73x ours (one forward of ours then 0.519 CPU s:
the grid is about 1,150 forwards' CPU time, Prisma's 3,135). The issue's goal of 3x faster than the per-layer loop is
out of reach for any exact grid: patching (l, p) changes every token from layer l + 1 on, so each cell runs its
remaining layers (sum over l of L - l = 78 layer passes per position, 1,280 forwards at 224 px); all that can be skipped
is what no later step reads (the last block's other tokens, done; block l's queries, keys and values of the tokens not
patched, about 4 % more). """

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # run as a script too; PYTHONPATH=<another checkout> times that checkout's code
from vit.explain.mechanism import components as mechanism  # noqa: E402
from vit.explain.mechanism import interventions  # noqa: E402
from vit.explain.views.mechanism_views import REFERENCE_CHUNK  # noqa: E402  (reference images run at once)
from vit.model import ViT, ViTConfig  # noqa: E402


def residual_loop_before(model, clean, corrupted):
    """The residual patching grid as it ran before batching across layers' tails (the main branch of
    2026-11-23): per layer, chunks of positions through every remaining layer, all tokens to the end."""
    clean_s, corrupt_s, _, _, a, b, _, grid = interventions._patching_setup(model, clean, corrupted, None, None)
    B, S, T, D = clean_s.shape
    L = len(model.blocks)
    out = torch.empty(B, L, T)
    chunk = interventions._chunks(T, T * max(D, model.config.mlp_size, T * model.blocks[0].attn.num_heads))
    for i in range(B):
        for layer in range(L):
            for start in range(0, T, chunk):
                positions = torch.arange(start, min(start + chunk, T))
                x = corrupt_s[i, layer].repeat(len(positions), 1, 1)  # (n, T, D): copy j patches positions[j]
                x[torch.arange(len(positions)), positions] = clean_s[i, layer, positions]
                final, _ = model.run_blocks(x, grid, layer)
                logits = model.classify(final)
                out[i, layer, start:start + len(positions)] = logits[:, a[i]] - logits[:, b[i]]
    return out


def residual_loop_hooks(model, clean, corrupted):
    """The grid as TransformerLens's ``run_with_hooks`` runs it: one whole forward of the corrupted image per cell,
    the clean residual put in by a plain torch forward pre-hook on the block (clean inputs read the same way)."""
    inputs = {}
    handles = [block.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
               for i, block in enumerate(model.blocks)]
    clean_logits = model(clean)[0]
    for handle in handles:
        handle.remove()
    a, b = int(clean_logits.argmax()), int(model(corrupted)[0].argmax())
    L, T = len(model.blocks), inputs[0].shape[1]
    out = torch.empty(1, L, T)
    for layer in range(L):
        for position in range(T):
            def patch(m, args, layer=layer, position=position):
                x = args[0].clone()
                x[:, position] = inputs[layer][:, position]
                return (x, *args[1:])

            handle = model.blocks[layer].register_forward_pre_hook(patch)
            logits = model(corrupted)[0]
            handle.remove()
            out[0, layer, position] = logits[0, a] - logits[0, b]
    return out


def prisma_twin(model: ViT, side: int):
    """ViT-Prisma's ``HookedViT`` (TransformerLens's hook points and ``run_with_hooks``, for vision) and ours on the
    same random weights: a timm ViT of ``model``'s shape, converted by each library's own converter."""
    import timm
    from vit_prisma.configs.HookedViTConfig import HookedViTConfig
    from vit_prisma.models.base_vit import HookedViT
    from vit_prisma.prisma_tools.loading_from_pretrained import convert_timm_weights

    from vit.sources.ports.libraries.import_timm import config_from_timm, state_dict_from_timm

    c = model.config
    torch.manual_seed(0)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=side, patch_size=c.patch_size,
                                  depth=c.num_layers, embed_dim=c.hidden_size, num_heads=c.num_heads,
                                  num_classes=c.num_classes).eval()
    config = HookedViTConfig(n_layers=c.num_layers, d_model=c.hidden_size, d_head=c.hidden_size // c.num_heads,
                             n_heads=c.num_heads, d_mlp=c.mlp_size, activation_name="gelu", eps=1e-6,
                             n_channels=c.num_channels, patch_size=c.patch_size, image_size=side,
                             n_classes=c.num_classes, return_type="class_logits", use_wandb=False)
    prisma = HookedViT(config)
    prisma.load_state_dict(convert_timm_weights(reference.state_dict(), config), strict=True)
    state = reference.state_dict()
    ours = ViT(config_from_timm("vit_base_patch16_224", state, {"num_heads": c.num_heads, "img_size": side}))
    ours.load_state_dict(state_dict_from_timm(state), strict=True)
    return prisma.eval(), ours.eval()


def residual_loop_prisma(prisma, clean, corrupted, layers: int | None = None):
    """The grid as TransformerLens's ``patching.get_act_patch_resid_pre`` runs it, on ViT-Prisma's ``HookedViT``:
    the clean run cached, then one ``run_with_hooks`` forward of the corrupted image per (layer, position), its
    ``blocks.{layer}.hook_resid_pre`` edited at that position. ``layers``: only the first that many layers' cells
    (each cell is one whole forward whatever its layer, so the whole grid costs L / layers times as much)."""
    clean_logits, cache = prisma.run_with_cache(clean, names_filter=lambda name: name.endswith("hook_resid_pre"))
    a, b = int(clean_logits.argmax()), int(prisma(corrupted).argmax())
    L, T = prisma.cfg.n_layers, cache["blocks.0.hook_resid_pre"].shape[1]
    out = torch.empty(1, L, T)
    for layer in range(L if layers is None else layers):
        name = f"blocks.{layer}.hook_resid_pre"
        for position in range(T):
            def patch(resid, hook, name=name, position=position):
                resid[:, position] = cache[name][:, position]
                return resid

            logits = prisma.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
            out[0, layer, position] = logits[0, a] - logits[0, b]
    return out


DEVICE = torch.device("cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def time_call(fn) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def cpu_call(fn) -> float:
    """The process's CPU seconds for ``fn()`` (all threads): on a machine shared with other jobs, the wall time
    mostly measures their load. On a GPU, the wall time between synchronisations (the CPU only launches)."""
    if DEVICE.type == "cuda":
        return time_call(fn)
    start = time.process_time()
    fn()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="repeats of the fast calls")
    p.add_argument("--residual-repeats", type=int, default=1,
                   help="repeats of the residual patching grid, the loop before and the torch-hook loop, in turn "
                        "(0: skip them; at 224 px ~3, 6 and 10 min on 2 cores)")
    p.add_argument("--check", action="store_true", help="first check that the two loops give the grid's numbers")
    p.add_argument("--preset", default="vit-base-16")
    p.add_argument("--size", type=int, default=0, help="input side in px (default: the preset's)")
    p.add_argument("--only", default="", help="comma-separated names of the calls to time (default: all)")
    p.add_argument("--residual-only", default="",
                   help="comma-separated names of the residual grids to run (default: all): batched, before, hooks, "
                        "prisma")
    p.add_argument("--prisma-layers", type=int, default=None,
                   help="time ViT-Prisma's loop over the first N layers' cells only, and scale its time by L / N")
    p.add_argument("--prisma", action="store_true",
                   help="build the model from random timm weights and add ViT-Prisma's run_with_hooks loop (a "
                        "TransformerLens-style baseline) on the same weights to the residual grids")
    p.add_argument("--device", default="cpu", help="cpu or cuda (there the residual grids are timed in wall seconds)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ViT(ViTConfig.from_preset(args.preset)).eval()
    c = model.config
    side = args.size or c.image_size
    prisma = None
    if args.prisma:
        prisma, model = prisma_twin(model, side)
        c = model.config
    model = model.to(DEVICE)
    clean, corrupted = torch.randn(2, 1, c.num_channels, side, side, device=DEVICE)
    references = torch.randn(REFERENCE_CHUNK, c.num_channels, side, side, device=DEVICE)
    calls = {
        "forward (baseline)": lambda: model(clean),
        "logit lens": lambda: mechanism.logit_lens(model, clean),
        "direct logit attribution": lambda: mechanism.direct_logit_attribution(model, clean),
        "ablation grid (zero)": lambda: mechanism.ablation_grid(model, clean),
        "head patching grid": lambda: mechanism.patch_heads(model, clean, corrupted),
        f"mean contexts ({len(references)} images)": lambda: mechanism.mean_contexts(model, references),
        "mean-ablated copy, 1 head": lambda: mechanism.ablated_copy(model, [(5, 3)], "mean", means),
    }
    if args.only:
        calls = {name: fn for name, fn in calls.items()
                 if name == "forward (baseline)" or any(w.strip() in name for w in args.only.split(","))}
    with torch.inference_mode():
        means = mechanism.mean_contexts(model, references)
    with torch.inference_mode():
        for fn in calls.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.repeats):
            for name, fn in calls.items():
                times[name].append(time_call(fn))
        residual = {"residual patching grid": lambda: mechanism.patch_residuals(model, clean, corrupted),
                    "residual grid, loop before": lambda: residual_loop_before(model, clean, corrupted),
                    "residual grid, torch hooks": lambda: residual_loop_hooks(model, clean, corrupted)}
        if prisma is not None:
            residual["residual grid, ViT-Prisma"] = lambda: residual_loop_prisma(prisma, clean, corrupted,
                                                                                 args.prisma_layers)
        if args.residual_only:
            keys = {"batched": "residual patching grid", "before": "residual grid, loop before",
                    "hooks": "residual grid, torch hooks", "prisma": "residual grid, ViT-Prisma"}
            wanted = {keys[w.strip()] for w in args.residual_only.split(",")}
            residual = {name: fn for name, fn in residual.items() if name in wanted}
        if args.residual_repeats and args.check:
            expected = residual["residual patching grid"]().patched
            for name in [n for n in residual if n != "residual patching grid"]:
                difference = (residual[name]() - expected).abs().max().item()
                print(f"{name}: largest difference to the batched grid {difference:.2e}")
        for _ in range(args.residual_repeats):  # in turn, so that background load slows all alike
            for name, fn in residual.items():
                seconds = cpu_call(fn)
                if name == "residual grid, ViT-Prisma" and args.prisma_layers:
                    seconds *= c.num_layers / args.prisma_layers  # every cell is one whole forward
                    print(f"(ViT-Prisma: the first {args.prisma_layers} layers' cells timed, scaled by "
                          f"{c.num_layers} / {args.prisma_layers})")
                times.setdefault(name, []).append(seconds)
                print(f"{name}: {times[name][-1]:.1f} CPU s", flush=True)
        times["forward (baseline)"].append(time_call(calls["forward (baseline)"]))
        if args.residual_repeats:  # the grids are in CPU seconds: so is their baseline
            forward_cpu = statistics.median(cpu_call(calls["forward (baseline)"]) for _ in range(5))
            for name in residual:
                print(f"{name}: {statistics.median(times[name]) / forward_cpu:.0f} forwards' CPU time "
                      f"(one forward {forward_cpu:.3f} CPU s)")
    base = statistics.median(times["forward (baseline)"])
    tokens = (side // c.patch_size) ** 2 + model.num_prefix_tokens
    print(f"{args.preset}, {side} px ({tokens} tokens, {c.num_layers} layers x {c.num_heads} heads), "
          f"{args.threads} thread(s), torch {torch.__version__}, {args.device}"
          + (f" ({torch.cuda.get_device_name(DEVICE)})" if DEVICE.type == "cuda" else ""))
    print(f"{'what':28s} {'median s':>10s} {'x forward':>10s}  runs")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:28s} {median:10.3f} {median / base:10.1f}  {len(values)}")
    if "residual patching grid" in times and len(residual) > 1:  # CPU seconds, each run in turn with the others
        grid = times["residual patching grid"]
        for name in [n for n in residual if n != "residual patching grid"]:
            ratio = statistics.median(o / g for o, g in zip(times[name], grid, strict=True))
            print(f"{name} / batched grid, CPU seconds: median ratio {ratio:.2f} over {len(grid)} turns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
