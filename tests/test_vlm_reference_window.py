"""A reference sliding window (R-SWA: Unlimited-OCR's text layers) keeps the prompt's keys apart from its window's
(transformers' ``UnlimitedOcrDynamicReferenceSlidingWindowLayer.prefill_keys``): a prompt shorter than the window,
whose keys the recorder leaves to the cache, is read from both, so each answer token's rows over every key it read
equal transformers' eager ``generate``'s. Before, the cache's window part alone (one key) was read, and every
attention reading refused "layer 0's cache keeps 1 keys from a sliding window"."""

from __future__ import annotations

import pytest
from test_vlm_sweep import narrowed
from vlm_saved import asked, assert_answer_is_generates, assert_rows_are_eager, saved

pytestmark = pytest.mark.slow

# 16 x 16 SAM patches at 256 px (4 x 4 image tokens): the prompt, ~27 tokens, is shorter than the text's window (128)
CANVAS = {"size": {"height": 256, "width": 256}}
WIDTHS = {"vision_config": {"sam_config": {"image_size": 256}}}


def test_a_prompt_shorter_than_a_reference_window_is_read_from_the_prompts_keys_and_the_windows(tmp_path):
    model = saved("unlimited_ocr", tmp_path, images=CANVAS, reshaped=lambda built: narrowed(built, WIDTHS))
    text = model.config.get_text_config()
    assert "reference_sliding_attention" in text.layer_types
    vlm, answer, inputs, outputs = asked(model, tmp_path)
    assert inputs["input_ids"].shape[1] + len(answer.tokens) < text.sliding_window  # the window never slid
    assert_answer_is_generates(answer, outputs["eager"], inputs)
    assert_rows_are_eager(answer, outputs["eager"])  # every row over every key read is eager's
    assert answer.attention(0, 0).shape == answer.layout.grid  # a reading that was refused draws
