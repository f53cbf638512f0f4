"""Training throughput: our data path and model against the seed blog's code, one epoch each.

    python bench/bench_train.py                         # 50,000 random 32x32 images
    python bench/bench_train.py --data data/cifar10/train --images 5000

Both sides train the tintn-cifar10 ViT (4 layers, width 48, 4 heads, patch 4) for one epoch of
CIFAR-10-sized data at batch 256 on the same machine and report images per second (the first
step of each is left out: it pays for allocation and warm-up).

- ours: the uint8 tensor dataset, batched augmentation and ``vit.trainer.Trainer.step`` (fused
  qkv attention through scaled_dot_product_attention), with our recipe (TrivialAugment) and with
  the seed recipe (flip + RandomResizedCrop, as the blog).
- seed: a faithful re-implementation of the blog's code (tintn/vision-transformer-from-scratch):
  one ``AttentionHead`` module per head with its own query/key/value Linear layers, outputs
  concatenated; a torchvision ``DataLoader`` over a dataset that hands out PIL images (as
  torchvision's CIFAR10 does) with per-sample RandomResizedCrop(32, scale=(0.8, 1.0)),
  RandomHorizontalFlip, ToTensor, Normalize; AdamW lr 1e-2, weight decay 1e-2.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from vit.core.images import ImageError, open_image, to_uint8  # noqa: E402
from vit.model import count_parameters  # noqa: E402
from vit.training.data import Dataset, Split, channel_stats  # noqa: E402
from vit.training.options import parse_args, resolve_model, settings_from_args  # noqa: E402
from vit.training.specs import IMAGE_EXTENSIONS  # noqa: E402
from vit.training.trainer import Trainer  # noqa: E402

BATCH = 256
CLASSES = 10

# ---------------------------------------------------------------------------------------------
# The seed blog's model, as written there (config: patch 4, hidden 48, 4 layers, 4 heads, MLP 192,
# no dropout, qkv bias, initializer range 0.02; its "use_faster_attention" path is not used).

SEED_CONFIG = {"patch_size": 4, "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
               "intermediate_size": 4 * 48, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
               "initializer_range": 0.02, "image_size": 32, "num_classes": CLASSES, "num_channels": 3,
               "qkv_bias": True}


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class PatchEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.image_size = config["image_size"]
        self.patch_size = config["patch_size"]
        self.num_channels = config["num_channels"]
        self.hidden_size = config["hidden_size"]
        self.num_patches = (self.image_size // self.patch_size) ** 2
        self.projection = nn.Conv2d(self.num_channels, self.hidden_size, kernel_size=self.patch_size,
                                    stride=self.patch_size)

    def forward(self, x):
        x = self.projection(x)
        x = x.flatten(2).transpose(1, 2)
        return x


class Embeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.patch_embeddings = PatchEmbeddings(config)
        self.cls_token = nn.Parameter(torch.randn(1, 1, config["hidden_size"]))
        self.position_embeddings = nn.Parameter(
            torch.randn(1, self.patch_embeddings.num_patches + 1, config["hidden_size"]))
        self.dropout = nn.Dropout(config["hidden_dropout_prob"])

    def forward(self, x):
        x = self.patch_embeddings(x)
        batch_size, _, _ = x.size()
        cls_tokens = self.cls_token.expand(batch_size, -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.position_embeddings
        x = self.dropout(x)
        return x


class AttentionHead(nn.Module):
    def __init__(self, hidden_size, attention_head_size, dropout, bias=True):
        super().__init__()
        self.hidden_size = hidden_size
        self.attention_head_size = attention_head_size
        self.query = nn.Linear(hidden_size, attention_head_size, bias=bias)
        self.key = nn.Linear(hidden_size, attention_head_size, bias=bias)
        self.value = nn.Linear(hidden_size, attention_head_size, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        query = self.query(x)
        key = self.key(x)
        value = self.value(x)
        attention_scores = torch.matmul(query, key.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        attention_output = torch.matmul(attention_probs, value)
        return (attention_output, attention_probs)


class MultiHeadAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config["hidden_size"]
        self.num_attention_heads = config["num_attention_heads"]
        self.attention_head_size = self.hidden_size // self.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.qkv_bias = config["qkv_bias"]
        self.heads = nn.ModuleList([])
        for _ in range(self.num_attention_heads):
            head = AttentionHead(self.hidden_size, self.attention_head_size,
                                 config["attention_probs_dropout_prob"], self.qkv_bias)
            self.heads.append(head)
        self.output_projection = nn.Linear(self.all_head_size, self.hidden_size)
        self.output_dropout = nn.Dropout(config["hidden_dropout_prob"])

    def forward(self, x, output_attentions=False):
        attention_outputs = [head(x) for head in self.heads]
        attention_output = torch.cat([attention_output for attention_output, _ in attention_outputs], dim=-1)
        attention_output = self.output_projection(attention_output)
        attention_output = self.output_dropout(attention_output)
        if not output_attentions:
            return (attention_output, None)
        attention_probs = torch.stack([attention_probs for _, attention_probs in attention_outputs], dim=1)
        return (attention_output, attention_probs)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_1 = nn.Linear(config["hidden_size"], config["intermediate_size"])
        self.activation = NewGELUActivation()
        self.dense_2 = nn.Linear(config["intermediate_size"], config["hidden_size"])
        self.dropout = nn.Dropout(config["hidden_dropout_prob"])

    def forward(self, x):
        x = self.dense_1(x)
        x = self.activation(x)
        x = self.dense_2(x)
        x = self.dropout(x)
        return x


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = MultiHeadAttention(config)
        self.layernorm_1 = nn.LayerNorm(config["hidden_size"])
        self.mlp = MLP(config)
        self.layernorm_2 = nn.LayerNorm(config["hidden_size"])

    def forward(self, x, output_attentions=False):
        attention_output, attention_probs = self.attention(self.layernorm_1(x), output_attentions=output_attentions)
        x = x + attention_output
        mlp_output = self.mlp(self.layernorm_2(x))
        x = x + mlp_output
        return (x, attention_probs if output_attentions else None)


class Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([Block(config) for _ in range(config["num_hidden_layers"])])

    def forward(self, x, output_attentions=False):
        all_attentions = []
        for block in self.blocks:
            x, attention_probs = block(x, output_attentions=output_attentions)
            if output_attentions:
                all_attentions.append(attention_probs)
        return (x, all_attentions if output_attentions else None)


class ViTForClassfication(nn.Module):  # sic, the blog's name
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embedding = Embeddings(config)
        self.encoder = Encoder(config)
        self.classifier = nn.Linear(config["hidden_size"], config["num_classes"])
        self.apply(self._init_weights)

    def forward(self, x, output_attentions=False):
        embedding_output = self.embedding(x)
        encoder_output, all_attentions = self.encoder(embedding_output, output_attentions=output_attentions)
        logits = self.classifier(encoder_output[:, 0, :])
        return (logits, all_attentions if output_attentions else None)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config["initializer_range"])
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)
        elif isinstance(module, Embeddings):
            module.position_embeddings.data = nn.init.trunc_normal_(
                module.position_embeddings.data.to(torch.float32), mean=0.0,
                std=self.config["initializer_range"]).to(module.position_embeddings.dtype)
            module.cls_token.data = nn.init.trunc_normal_(
                module.cls_token.data.to(torch.float32), mean=0.0,
                std=self.config["initializer_range"]).to(module.cls_token.dtype)


class PILImages(torch.utils.data.Dataset):
    """Images as torchvision's CIFAR10 hands them out: a PIL image per item, then the transform."""

    def __init__(self, pixels: np.ndarray, labels: np.ndarray, transform) -> None:
        self.data, self.targets, self.transform = pixels, labels, transform  # (N, 32, 32, 3) uint8

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        image = Image.fromarray(self.data[index])
        return self.transform(image), int(self.targets[index])


def seed_blog_epoch(pixels: np.ndarray, labels: np.ndarray, device: torch.device, workers: int) -> float:
    """Images per second of one epoch of the seed blog's training loop."""
    transform = transforms.Compose([
        transforms.RandomResizedCrop((32, 32), scale=(0.8, 1.0), ratio=(0.75, 1.3333333333333333),
                                     interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.RandomHorizontalFlip(p=0.5),
        transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ])
    loader = DataLoader(PILImages(pixels, labels, transform), batch_size=BATCH, shuffle=True, num_workers=workers)
    model = ViTForClassfication(SEED_CONFIG).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    start, images = None, 0
    for batch, labels_ in loader:
        batch, labels_ = batch.to(device), labels_.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(batch)[0], labels_)
        loss.backward()
        optimizer.step()
        loss.item()  # the blog accumulates loss.item() every step
        if start is None:
            start = time.perf_counter()
        else:
            images += len(batch)
    _sync(device)
    return images / (time.perf_counter() - start)


def ours_epoch(images: torch.Tensor, labels: torch.Tensor, device: torch.device, recipe: str) -> tuple[float, int]:
    """Images per second of one epoch of ``Trainer.step`` with ``recipe``, and the model's size."""
    with tempfile.TemporaryDirectory() as tmp:
        args = parse_args(["--dataset", "folder:unused", "--out", str(Path(tmp) / "run"), "--preset",
                           "tintn-cifar10", "--recipe", recipe, "--epochs", "1", "--batch-size", str(BATCH),
                           "--device", str(device)])
    resolve_model(args, CLASSES)
    mean, std = channel_stats(images)
    val = Split(images[:BATCH], labels[:BATCH])
    data = Dataset("bench", [str(c) for c in range(CLASSES)], Split(images, labels), val, mean, std, True)
    trainer = Trainer(settings_from_args(args), data, run_dir=None, device=device)
    order = trainer.epoch_order(0)
    trainer.net.train()
    start, count = None, 0
    for step in range(trainer.steps_per_epoch):
        idx = order[step * BATCH:(step + 1) * BATCH]
        trainer.step(idx)
        if start is None:
            start = time.perf_counter()
        else:
            count += len(idx)
    _sync(device)
    return count / (time.perf_counter() - start), count_parameters(trainer.model)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_images(folder: str | None, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``n`` 32x32 RGB images as uint8 ``(n, 3, 32, 32)`` with labels: from ``folder``'s class
    subfolders (taken in turn, so every class is represented) or random pixels and labels."""
    if folder is None:
        generator = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator)
        return images, torch.randint(0, CLASSES, (n,), generator=generator), "random"
    root = Path(folder)
    if not root.is_dir():
        raise SystemExit(f"bench_train: {root} is not a folder")
    classes = sorted(p for p in root.iterdir() if p.is_dir())[:CLASSES]
    if len(classes) < 2:
        raise SystemExit(f"bench_train: {root} needs class subfolders of images")
    files = [sorted(f for f in c.rglob("*") if f.suffix.lower() in IMAGE_EXTENSIONS) for c in classes]
    picked = [(label, fs[i]) for i in range(max(map(len, files))) for label, fs in enumerate(files) if i < len(fs)][:n]
    images, labels = [], []
    for label, file in picked:
        try:
            images.append(to_uint8(open_image(file), 32, 3))
            labels.append(label)
        except ImageError:
            continue
    return torch.stack(images), torch.tensor(labels), f"from {root}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="an image folder (<class>/<image>), e.g. data/cifar10/train; "
                        "default: random images")
    parser.add_argument("--images", type=int, default=50_000, help="images in the epoch (default 50000)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the seed code (the blog's 2)")
    args = parser.parse_args(argv)
    if args.images < 2 * BATCH:
        parser.error(f"--images must be at least {2 * BATCH} (two batches: the first is not timed)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    images, labels, source = load_images(args.data, args.images)
    pixels, targets = images.permute(0, 2, 3, 1).contiguous().numpy(), labels.numpy()
    print(f"{len(images)} images ({source}), batch {BATCH}, one epoch each on {device}, "
          f"{torch.get_num_threads()} threads")

    rows = []
    for recipe, what in (("ours", "TrivialAugment + crop/flip"), ("seed", "flip + RandomResizedCrop")):
        rate, params = ours_epoch(images, labels, device, recipe)  # the Trainer moves them to a GPU
        rows.append((f"ours, recipe {recipe} ({what}; {params:,} parameters)", rate))
    torch.manual_seed(0)
    seed_params = count_parameters(ViTForClassfication(SEED_CONFIG))
    rate = seed_blog_epoch(pixels, targets, device, args.workers)
    rows.append((f"seed blog code ({args.workers} DataLoader workers; {seed_params:,} parameters)", rate))
    width = max(len(name) for name, _ in rows)
    for name, rate in rows:
        print(f"{name:<{width}}  {rate:8.0f} images/s")
    for name, rate in rows[:-1]:
        print(f"{name.split(' (')[0]} / seed blog code: {rate / rows[-1][1]:.2f}x")


if __name__ == "__main__":
    main()
