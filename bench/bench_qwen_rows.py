"""One query's row of a Qwen 2.5-VL tower at about 5,000 tokens (issue 117, Speed: "only the asked rows formed").

A Qwen 2.5-VL-shaped vision tower as transformers builds it (16 heads, 14-px patches, 2x2 merge units, 112-px
windows; two layers, the first windowed, the second global; 64 wide, random weights), saved to a temporary folder
with its processor and opened by ``vit.load`` (``merged_towers``), then ``run(x, layers=[0, 1], rows=[0])`` of one
1008 x 980-px image (72 x 70 patches, 5,040 tokens) at the default memory bound (or ``VIT_ANALYSIS_MEMORY_MB``).
Prints whether it opened, its CPU seconds (one thread) and the process's peak RSS growth over the call. Run from the
repository root::

    python -m bench.bench_qwen_rows
"""

from __future__ import annotations

import os
import resource
import tempfile
import time


def main() -> None:
    os.environ.setdefault("VIT_MAX_TOKENS", "10000")  # the tower is run past the explorer's default token gate
    import torch
    import transformers

    import vit

    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        config = transformers.Qwen2_5_VLVisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=16,
                                                     out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                                                     window_size=112, fullatt_block_indexes=[1])
        transformers.Qwen2_5_VisionTransformerPretrainedModel(config).save_pretrained(folder)
        transformers.Qwen2VLImageProcessor(patch_size=14, merge_size=2, size=dict(
            shortest_edge=56 * 56, longest_edge=896 * 896)).save_pretrained(folder)
        torch.set_num_threads(1)
        model = vit.load(folder, device="cpu").model
        x = torch.randn(1, 3, 1008, 980)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.process_time()
        try:
            _, kept = model.run(x, layers=[0, 1], rows=[0])
        except Exception as e:  # noqa: BLE001 - the refusal is the measurement
            print(f"refused: {type(e).__name__}: {str(e)[:300]}")
            return
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(f"opened: {[tuple(v.shape) for v in kept.values()]}, CPU {time.process_time() - start:.2f} s, "
              f"peak RSS +{grown:.0f} MB")


if __name__ == "__main__":
    main()
