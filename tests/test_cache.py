"""ByteCache: the app's server-wide caches are bounded by the bytes they hold, not by their number of entries."""

import threading

import numpy as np
import torch
from PIL import Image

from vit.core.cache import ByteCache, nbytes
from vit.model import ViT, ViTConfig

MB = 2**20


def block(megabytes: int) -> np.ndarray:
    return np.zeros(megabytes * MB, dtype=np.uint8)


def test_nbytes_counts_arrays_tensors_images_and_what_holds_them():
    assert nbytes(block(1)) == MB
    assert nbytes(torch.zeros(256, dtype=torch.float32)) == 1024
    assert nbytes(Image.new("RGB", (10, 20))) == 600
    assert nbytes({"a": [block(1), (torch.zeros(256),)], "b": b"xyz"}) == MB + 1024 + 3 + 2  # + the keys


def test_nbytes_counts_memory_shared_by_an_array_and_a_tensor_once():
    array = np.zeros(1000, dtype=np.float32)
    assert nbytes((array, torch.from_numpy(array), array[:10], torch.from_numpy(array)[None])) == 4000


def test_nbytes_of_a_model_is_its_weights():
    model = ViT(ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32))
    assert nbytes(model) == 4 * sum(p.numel() for p in model.parameters())


def test_a_hit_does_not_recompute():
    cache, calls = ByteCache(10 * MB), []
    for _ in range(3):
        cache.get_or_compute("k", lambda: calls.append(1) or block(1))
    assert calls == [1]


def test_least_recently_used_values_go_first_once_the_bytes_run_out():
    cache = ByteCache(10 * MB)
    for key in "abc":
        cache.get_or_compute(key, lambda: block(4))
    assert "a" not in cache and "b" in cache and "c" in cache  # 12 MB asked for, 10 allowed
    cache.get_or_compute("b", lambda: block(4))  # a hit makes b the most recent
    cache.get_or_compute("d", lambda: block(4))
    assert set("bd") == {k for k in "abcd" if k in cache}
    assert cache.bytes == 8 * MB


def test_many_small_values_all_fit_where_an_entry_count_would_have_dropped_them():
    cache = ByteCache(10 * MB)
    for i in range(100):
        cache.get_or_compute(i, lambda: np.zeros(1000, dtype=np.uint8))
    assert len(cache) == 100


def test_a_value_larger_than_the_budget_is_returned_but_not_kept():
    cache = ByteCache(1 * MB)
    assert len(cache.get_or_compute("big", lambda: block(2))) == 2 * MB
    assert "big" not in cache and cache.bytes == 0


def test_a_value_over_its_max_share_is_returned_but_not_kept():
    cache = ByteCache(8 * MB)
    cache.get_or_compute("small", lambda: block(1))
    assert len(cache.get_or_compute("big", lambda: block(2), max_share=0.125)) == 2 * MB
    assert "big" not in cache and "small" in cache and cache.bytes == MB


def test_errors_are_not_cached():
    cache = ByteCache(MB)
    try:
        cache.get_or_compute("k", lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    assert cache.get_or_compute("k", lambda: "ok") == "ok"


def test_threads_never_push_it_over_budget():
    cache = ByteCache(8 * MB)

    def work(offset: int) -> None:
        for i in range(20):
            cache.get_or_compute((offset + i) % 30, lambda: block(1))

    threads = [threading.Thread(target=work, args=(t * 7,)) for t in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.bytes <= 8 * MB and cache.bytes == MB * len(cache)
