"""Training a TopK SAE on a layer's residual stream, and the held-out pass that measures and describes it.

The recipe is Gao et al. 2024's ("Scaling and evaluating sparse autoencoders"): the decoder bias starts at the
activations' mean, the encoder as the decoder's transpose; Adam with the learning rate scaled by 1/sqrt(width) as
theirs (but higher: our runs are short), falling linearly to zero over the last fifth of the steps (SAELens's
``lr_decay_steps``); after each step the decoder rows go back to unit norm, the gradient along them removed first; the
AuxK loss (weight 1/32) makes the latents that have not fired for ``dead_tokens`` tokens reconstruct what the live
ones miss.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from vit.features.autoencoder import MAX_D_SAE, SAEError, SparseAutoencoder, available_memory

EXEMPLARS = 16  # top activating (image, token) pairs kept per latent in features.npz
HISTOGRAM_EDGES = np.logspace(-4, 4, 65)  # log-spaced bins of a latent's non-zero activations (8 decades)


@dataclass
class SAESettings:
    """How ``python -m vit.sae train`` trains; the defaults are the recipe that reaches EV 0.8 on cifar-s."""

    layer: int  # the residual stream after this block, counted from 1
    width: int  # latents (d_sae); --expansion E gives E x the model's width
    k: int = 16  # latents kept per token
    epochs: int = 5
    batch_size: int = 512  # tokens per step: 1,270 steps in the default recipe (EV 0.855 against 0.845 at 1,024)
    lr: float | None = None  # None: 6e-3 / sqrt(width / 768), Gao et al.'s width scaling anchored where we measured
    buffer_tokens: int = 65536  # rows in the shuffle buffer (64 batches' worth: tokens of ~1,000 cifar images)
    aux_coefficient: float = 1 / 32  # Gao et al.'s AuxK weight
    dead_tokens: int = 50_000  # a latent that has not fired for this many training tokens counts as dead
    decay: float = 0.2  # the share of steps at the end over which the rate falls linearly to zero
    seed: int = 0

    @property
    def learning_rate(self) -> float:
        # Gao et al.'s 2e-4 / sqrt(width / 2**14) is 9e-4 at 768 latents: tuned for billions of tokens, it left
        # cifar-s's default at EV 0.80 after 5 epochs, where 6e-3 (and the decay) reach 0.86.
        return self.lr if self.lr is not None else 6e-3 / math.sqrt(self.width / 768)


def memory_needed(d_in: int, width: int, batch_size: int, buffer_tokens: int, held_out_rows: int = 0) -> int:
    """Bytes a training run holds at once: weights, their gradients and Adam's two moments (4 copies), the buffer,
    and per step the activations, pre-activations, latents and their gradients (float32); then the held-out pass
    over ``held_out_rows`` tokens at a time (an image batch's): their pre-activations, latents and firing mask, and
    per latent its exemplars and histogram."""
    weights = 2 * d_in * width + width + d_in
    training = 4 * (4 * weights + buffer_tokens * d_in + batch_size * (4 * width + 4 * d_in))
    held_out = held_out_rows * width * (2 * 4 + 1) + width * (64 * 8 + EXEMPLARS * 12)
    return training + held_out


def largest_width(d_in: int, batch_size: int, buffer_tokens: int, held_out_rows: int, bound: int) -> int:
    """The most latents (0 if none) whose run ``memory_needed`` keeps within ``bound`` bytes."""
    low, high = 0, MAX_D_SAE
    while low < high:
        middle = (low + high + 1) // 2
        if memory_needed(d_in, middle, batch_size, buffer_tokens, held_out_rows) <= bound:
            low = middle
        else:
            high = middle - 1
    return low


def check_settings(settings: SAESettings, d_in: int, num_layers: int, device: torch.device,
                   held_out_rows: int = 0) -> None:
    """SAEError in one line for settings no run can use or memory cannot hold (``held_out_rows``: the tokens of
    one image batch in the held-out pass), before anything runs; it says how many latents would fit."""
    s = settings
    if not 1 <= s.layer <= num_layers:
        raise SAEError(f"--layer {s.layer} is out of range: the model has blocks 1 to {num_layers}")
    if not 1 <= s.width <= MAX_D_SAE:
        raise SAEError(f"the width must be 1 to {MAX_D_SAE:,} latents, got {s.width:,}")
    if not 1 <= s.k <= s.width:
        raise SAEError(f"--k {s.k} must be from 1 to the width ({s.width:,})")
    if s.buffer_tokens < 2 * s.batch_size:
        raise SAEError(f"--buffer-tokens {s.buffer_tokens:,} must hold two batches of {s.batch_size:,} tokens")
    need = memory_needed(d_in, s.width, s.batch_size, s.buffer_tokens, held_out_rows)
    free = available_memory(device)
    if need > free // 2:  # the model and the harvest's forward need their share too
        fits = largest_width(d_in, s.batch_size, s.buffer_tokens, held_out_rows, free // 2)
        raise SAEError(f"width {s.width:,}, batch {s.batch_size:,} and a buffer of {s.buffer_tokens:,} tokens need "
                       f"{need / 2**30:.2f} GiB, more than half of the {free / 2**30:.2f} GiB free on {device}; "
                       + (f"at most {fits:,} latents fit with this batch and buffer: lower --expansion/--width"
                          if fits >= s.k else "lower --buffer-tokens, --batch-size or --image-batch"))


@dataclass
class StepRecord:
    """What a step reports: the progress bar shows it, steps.jsonl keeps it."""

    step: int
    epoch: int
    mse: float  # mean squared error per element
    explained_variance: float  # of this batch, around its own mean
    l0: float
    dead_fraction: float
    aux_loss: float


class Stopped(Exception):
    """Raised by a batch source between two steps when a stop was asked for while it harvested (filling the
    shuffle buffer takes many forwards): ``SAETraining.run`` ends there as after a step."""


class SAETraining:
    """A TopK SAE's training as a state that can be saved between any two steps and resumed exactly.

    ``run(batches)`` trains on ``batches(epoch)``, the shuffled ``(rows, d_in)`` activations of one epoch each time
    (the same rows in the same order whenever asked again: a resumed run skips the batches it has done), until the
    last epoch ends or ``should_stop()`` says so after a step. ``state_dict()`` holds everything a resume needs (the
    SAE, Adam's moments, the rate schedule, how long each latent has been dead, where in which epoch, the training
    mean so far), so a run stopped and resumed ends with the weights of one that was not.
    """

    def __init__(self, d_in: int, settings: SAESettings, device: torch.device, total_steps: int | None = None
                 ) -> None:
        s = settings
        self.d_in, self.settings, self.device, self.total_steps = d_in, settings, device, total_steps
        torch.manual_seed(s.seed)
        self.sae = SparseAutoencoder(d_in, s.width, s.k).to(device)
        self.sae.normalize_decoder()
        self.optimizer = torch.optim.Adam(self.sae.parameters(), lr=s.learning_rate)
        decay_steps = max(1, round(s.decay * total_steps)) if total_steps and s.decay else None

        def rate(step: int) -> float:  # SAELens's lr_decay_steps: constant, then a linear fall to zero
            return min(1.0, max(total_steps - step, 0) / decay_steps) if decay_steps else 1.0

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, rate)
        self.since_fired = torch.zeros(s.width, dtype=torch.long, device=device)  # training tokens since last fired
        self.step = 0
        self.epoch = 1  # the epoch in progress (settings.epochs + 1 once done)
        self.step_in_epoch = 0  # batches of it trained on
        self.initialised = False
        self.mean_sum = torch.zeros(d_in, dtype=torch.float64)  # the first epoch's rows: the mean-ablation baseline
        self.mean_count = 0

    @property
    def done(self) -> bool:
        return self.epoch > self.settings.epochs

    @property
    def mean(self) -> Tensor:
        """The mean training activation ``(d_in,)`` (of the first epoch's rows: every training token once)."""
        return (self.mean_sum / max(self.mean_count, 1)).float()

    def run(self, batches: Callable[[int], Iterable[Tensor]], on_step: Callable[[StepRecord], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> bool:
        """Train from where the state stands; True once every epoch is done, False when stopped after a step."""
        while not self.done:
            skip = self.step_in_epoch
            try:
                for index, x in enumerate(batches(self.epoch)):
                    if index < skip:  # done before the resume: the same rows, already trained on
                        continue
                    self._train_step(x, on_step)
                    if should_stop is not None and should_stop():
                        return False
            except Stopped:
                return False
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return True

    def _train_step(self, x: Tensor, on_step: Callable[[StepRecord], None] | None) -> None:
        s, sae = self.settings, self.sae
        x = x.to(self.device)
        if self.epoch == 1:
            self.mean_sum += x.sum(dim=0).double().cpu()
            self.mean_count += len(x)
        if not self.initialised:  # Gao et al. start b_dec at the geometric median; the mean of a batch is close
            with torch.no_grad():
                sae.b_dec.copy_(x.mean(dim=0))
            self.initialised = True
        pre = sae.pre_activations(x)
        z = sae.activate(pre)
        x_hat = sae.decode(z)
        mse = (x_hat - x).pow(2).sum(dim=-1).mean()
        dead = self.since_fired >= s.dead_tokens
        aux = sae.aux_k_loss(x, x_hat, pre, dead, s.aux_coefficient)
        self.optimizer.zero_grad(set_to_none=True)
        (mse + aux).backward()
        sae.remove_parallel_gradient()
        self.optimizer.step()
        self.scheduler.step()
        sae.normalize_decoder()
        self.step += 1
        self.step_in_epoch += 1
        with torch.no_grad():
            fired = (z > 0).any(dim=0)
            self.since_fired += len(x)
            self.since_fired[fired] = 0
            if on_step is not None:
                total = (x - x.mean(dim=0)).pow(2).sum()
                on_step(StepRecord(self.step, self.epoch, float(mse) / self.d_in,
                                   float(1 - mse * len(x) / total.clamp(min=1e-12)),
                                   float((z > 0).sum(dim=-1).float().mean()), float(dead.float().mean()),
                                   float(aux)))

    def state_dict(self) -> dict:
        """Everything a resume needs, as tensors and plain values (``torch.load(weights_only=True)`` reads it)."""
        return {"sae": {k: v.detach().cpu() for k, v in self.sae.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "since_fired": self.since_fired.cpu(), "step": self.step, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch, "initialised": self.initialised,
                "mean_sum": self.mean_sum, "mean_count": self.mean_count, "d_in": self.d_in,
                "width": self.settings.width}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output; SAEError in one line when it is not this run's."""
        try:
            if (state["d_in"], state["width"]) != (self.d_in, self.settings.width):
                raise SAEError(f"last.pt holds a {state['d_in']} x {state['width']} SAE, not this run's "
                               f"{self.d_in} x {self.settings.width}")
            self.sae.load_state_dict(state["sae"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            since = state["since_fired"]
            if not isinstance(since, Tensor) or since.shape != self.since_fired.shape:
                raise SAEError("last.pt's dead-latent counts do not fit its SAE")
            self.since_fired.copy_(since)
            self.step, self.epoch, self.step_in_epoch = int(state["step"]), int(state["epoch"]), \
                int(state["step_in_epoch"])
            self.initialised, self.mean_count = bool(state["initialised"]), int(state["mean_count"])
            if not isinstance(state["mean_sum"], Tensor) or state["mean_sum"].shape != self.mean_sum.shape:
                raise SAEError("last.pt's training mean does not fit its SAE")
            self.mean_sum = state["mean_sum"].double().cpu()
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            if isinstance(e, SAEError):
                raise
            raise SAEError(f"last.pt is not an SAE run's checkpoint ({type(e).__name__}: {str(e)[:120]})") from None

    def finished(self) -> SparseAutoencoder:
        return self.sae.eval().requires_grad_(False)


def train_sae(batches: Callable[[int], Iterable[Tensor]], d_in: int, settings: SAESettings,
              device: torch.device, on_step: Callable[[StepRecord], None] | None = None,
              total_steps: int | None = None) -> SparseAutoencoder:
    """An SAE trained on ``batches(epoch)``, the shuffled ``(rows, d_in)`` activations of one epoch each time;
    with ``total_steps`` the rate decays linearly to zero over the last ``settings.decay`` of them."""
    training = SAETraining(d_in, settings, device, total_steps)
    training.run(batches, on_step)
    return training.finished()


class HeldOut:
    """Everything the held-out pass accumulates, image batch by image batch: the sums behind the metrics and,
    per latent, its top exemplars and a histogram (``features.npz``)."""

    def __init__(self, sae: SparseAutoencoder, exemplars: int = EXEMPLARS) -> None:
        n, device = sae.d_sae, sae.W_dec.device
        self.sae = sae
        self.tokens = 0
        self.sum_x = torch.zeros(sae.d_in, dtype=torch.float64, device=device)
        self.sum_x2 = torch.zeros((), dtype=torch.float64, device=device)
        self.sse = torch.zeros((), dtype=torch.float64, device=device)
        self.active = torch.zeros((), dtype=torch.float64, device=device)
        self.counts = torch.zeros(n, dtype=torch.long, device=device)  # tokens on which each latent fired
        self.top_values = torch.full((n, exemplars), -1.0, device=device)  # -1: no exemplar yet
        self.top_rows = torch.full((n, exemplars), -1, dtype=torch.long, device=device)  # image * T + token
        self.histogram = torch.zeros(n * (len(HISTOGRAM_EDGES) - 1), dtype=torch.long, device=device)
        self.edges = torch.as_tensor(HISTOGRAM_EDGES, dtype=torch.float32, device=device)
        self.images = 0
        self.num_tokens_per_image = 0
        self.classifier: dict[str, float] = {"ce_clean": 0.0, "ce_reconstructed": 0.0, "ce_mean_ablated": 0.0,
                                             "kl": 0.0, "agree": 0.0}
        self.has_classifier = True

    @torch.no_grad()
    def add(self, tokens: Tensor) -> Tensor:
        """One batch of images' activations ``(B, T, D)``: accumulates and returns the reconstruction."""
        B, T, D = tokens.shape
        x = tokens.reshape(B * T, D).float()
        z = self.sae.encode(x)  # (B*T, d_sae)
        x_hat = self.sae.decode(z)
        self.tokens += len(x)
        self.sum_x += x.sum(dim=0).double()
        self.sum_x2 += x.double().pow(2).sum()
        self.sse += (x - x_hat).double().pow(2).sum()
        fired = z > 0
        self.active += fired.sum()
        self.counts += fired.sum(dim=0)
        rows = torch.arange(len(x), device=x.device) + self.images * T
        # Top exemplars: each latent's best rows of this batch merged with those kept so far.
        take = min(self.top_values.shape[1], len(x))
        values, index = z.T.topk(take, dim=-1)  # (d_sae, take)
        merged_values = torch.cat([self.top_values, values], dim=1)
        merged_rows = torch.cat([self.top_rows, rows[index]], dim=1)
        order = merged_values.topk(self.top_values.shape[1], dim=1).indices
        self.top_values = merged_values.gather(1, order)
        self.top_rows = merged_rows.gather(1, order)
        # Histograms of the non-zero activations: one bincount over (latent, bin) pairs.
        latent = fired.nonzero()[:, 1]
        bins = (torch.bucketize(z[fired], self.edges) - 1).clamp(0, len(self.edges) - 2)
        self.histogram += torch.bincount(latent * (len(self.edges) - 1) + bins, minlength=len(self.histogram))
        self.images += B
        self.num_tokens_per_image = T
        return x_hat.reshape(B, T, D)

    @torch.no_grad()
    def add_logits(self, clean: Tensor | None, reconstructed: Tensor | None, mean_ablated: Tensor | None) -> None:
        """The model's logits ``(B, classes)`` on the held-out images as they are, with the layer's output replaced
        by the reconstruction, and by the training mean: cross-entropies against the clean top-1."""
        if clean is None:
            self.has_classifier = False
            return
        target = clean.argmax(dim=-1)
        log_clean = clean.float().log_softmax(dim=-1)
        log_rec = reconstructed.float().log_softmax(dim=-1)
        ce = torch.nn.functional.nll_loss
        self.classifier["ce_clean"] += float(ce(log_clean, target, reduction="sum"))
        self.classifier["ce_reconstructed"] += float(ce(log_rec, target, reduction="sum"))
        self.classifier["ce_mean_ablated"] += float(ce(mean_ablated.float().log_softmax(dim=-1), target,
                                                       reduction="sum"))
        self.classifier["kl"] += float((log_clean.exp() * (log_clean - log_rec)).sum())
        self.classifier["agree"] += float((reconstructed.argmax(dim=-1) == target).sum())

    def metrics(self) -> dict:
        """metrics.json's numbers: explained variance (1 - SSE / the tokens' total variance around their mean),
        L0, the share of latents that never fired, and with a classifier the downstream cost."""
        n = max(self.tokens, 1)
        total = float(self.sum_x2 - self.sum_x.pow(2).sum() / n)
        result = {"tokens": self.tokens, "images": self.images,
                  "explained_variance": 1 - float(self.sse) / max(total, 1e-12),
                  "mse": float(self.sse) / (n * self.sae.d_in), "l0": float(self.active) / n,
                  "dead_fraction": float((self.counts == 0).float().mean())}
        if self.has_classifier and self.images:
            c = {key: value / self.images for key, value in self.classifier.items()}
            gap = c["ce_mean_ablated"] - c["ce_clean"]
            result.update(ce_clean=c["ce_clean"], ce_reconstructed=c["ce_reconstructed"],
                          ce_mean_ablated=c["ce_mean_ablated"],
                          ce_recovered=(c["ce_mean_ablated"] - c["ce_reconstructed"]) / gap if gap > 0 else None,
                          kl_divergence=c["kl"], top1_agreement=c["agree"])
        return result

    def features(self, image_names: list[str]) -> bytes:
        """features.npz: per latent its top exemplars (``exemplar_values``, ``exemplar_images``,
        ``exemplar_tokens``; -1 where fewer fired), its activation histogram over ``histogram_edges`` and how often
        it fired (``frequency``); ``images`` names the held-out images the exemplars index."""
        T = max(self.num_tokens_per_image, 1)
        rows = self.top_rows.cpu().numpy()
        values = self.top_values.cpu().numpy()
        empty = values <= 0
        buffer = io.BytesIO()
        np.savez(buffer, exemplar_values=np.where(empty, 0, values).astype(np.float32),
                 exemplar_images=np.where(empty, -1, rows // T).astype(np.int32),
                 exemplar_tokens=np.where(empty, -1, rows % T).astype(np.int32),
                 histograms=self.histogram.reshape(self.sae.d_sae, -1).cpu().numpy().astype(np.int64),
                 histogram_edges=HISTOGRAM_EDGES.astype(np.float32),
                 frequency=(self.counts.double() / max(self.tokens, 1)).cpu().numpy().astype(np.float32),
                 images=np.array(image_names, dtype=str), tokens_per_image=np.int32(T))
        return buffer.getvalue()


@torch.no_grad()
def held_out_pass(model: torch.nn.Module, sae: SparseAutoencoder, layer: int, batches: Iterable[Tensor],
                  mean: Tensor) -> HeldOut:
    """One pass over held-out image batches: the layer's activations through ``sae`` and, for a classifier, the
    logits as they are, with the layer's output replaced by the reconstruction and by ``mean`` (D,) (the blocks
    after the layer run again from the replaced stream: ``ViT.run_blocks``)."""
    from vit.features.autoencoder import resid_hook_name

    held = HeldOut(sae)
    name = resid_hook_name(layer)
    for images in batches:
        encoding, cache = model.run_with_cache(images, [name])
        tokens = cache[name]  # (B, T, D)
        x_hat = held.add(tokens)
        if encoding.logits is None:
            held.add_logits(None, None, None)
            continue
        grid = model.patch_grid(images.shape[2], images.shape[3])
        rec = model.classify(model.run_blocks(x_hat.to(tokens.dtype), grid, layer)[0])
        abl = model.classify(model.run_blocks(mean.to(tokens)[None, None].expand_as(tokens), grid, layer)[0])
        held.add_logits(encoding.logits, rec, abl)
    return held


def settings_record(settings: SAESettings) -> dict:
    return {**asdict(settings), "learning_rate": settings.learning_rate}
