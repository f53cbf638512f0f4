"""A tiny VLM saved whole and asked, with transformers' own greedy ``generate`` beside it (issue 113's tests of the
types the VLM census builds): the model built by the census's generic builder (``bench.census_vlm.generic_build``)
with its own processor, its text config edited where a test needs it, its weights spread (``test_vlm_answer.noisy``),
saved with its processor; asked through ``vit.open_vlm`` / ``vit.ask_vlm``; and the reference, the folder's model
from ``from_pretrained`` under a named attention implementation, generating greedily with every step's attentions
(eager)."""

from __future__ import annotations

import numpy as np
import torch
from test_vlm_answer import NEW_TOKENS, QUESTION, eager_generate, eager_image_rows, noisy, picture, processor_inputs

import vit


def saved(kind: str, folder, text: dict | None = None, images: dict | None = None,
          reshaped=None) -> torch.nn.Module:
    """``kind`` built tiny (seed 0) by the census's generic builder, its text config's ``text`` fields set (then built
    again, seed 0, from that config), then passed through ``reshaped`` where given (a model -> model, e.g.
    test_vlm_sweep's ``narrowed``), and its image processor's ``images`` fields, saved whole with its processor in
    ``folder``; the model."""
    from bench.census_vlm import generic_build

    torch.manual_seed(0)
    model, processor = generic_build(kind)
    if text:
        config = model.config
        for name, value in text.items():
            setattr(config.get_text_config(), name, value)
        torch.manual_seed(0)
        model = type(model)(config)
    if reshaped is not None:
        model = reshaped(model)
    for name, value in (images or {}).items():
        setattr(processor.image_processor, name, value)
    noisy(model).save_pretrained(folder)
    processor.save_pretrained(folder)
    return model


def generated(model: torch.nn.Module, folder, inputs, implementation: str = "eager"):
    """transformers alone: ``folder``'s model (``model``'s class) under ``implementation``, greedy ``generate`` of
    ``NEW_TOKENS`` tokens, with every step's attentions where it is eager."""
    reference = type(model).from_pretrained(folder, attn_implementation=implementation).eval()
    with torch.no_grad():
        return reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                                  output_attentions=implementation == "eager")


def asked(model: torch.nn.Module, folder, implementations=("eager",)):
    """``(vlm, its answer to QUESTION about picture(), the processor's inputs, {implementation: generate's output})``
    for the model saved in ``folder``."""
    vlm = vit.open_vlm(folder)
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    inputs = processor_inputs(folder, picture())
    return vlm, answer, inputs, {name: generated(model, folder, inputs, name) for name in implementations}


def answered_tokens(out, inputs) -> list[int]:
    """The tokens ``generate`` answered, after the prompt."""
    return out.sequences[0, inputs["input_ids"].shape[1]:].tolist()


def assert_rows_are_eager(answer, out) -> int:
    """Each answer token's row at every layer ``out`` (eager ``generate``) has equals its eager row over the keys
    the query may read; the count of those eager entries that are 0 (keys a sparse mask dropped)."""
    dropped = 0
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            seen = out.attentions[0][layer].shape[-2] + i
            eager = out.attentions[i][layer][0, :, -1, :seen]  # (H, seen)
            dropped += int((eager == 0).sum())
            np.testing.assert_allclose(answer.row(i, layer).numpy(), eager.numpy(), rtol=0, atol=1e-5)
    return dropped


def census_answers(tmp_path_factory, kinds, reference=None) -> dict:
    """``{kind: (vit's answer, transformers' eager generate output, the prompt's inputs, the image token's id)}``:
    each of ``kinds`` built tiny by the census's generic builder and saved whole (``saved``), asked about
    ``picture()``, beside ``reference(folder, image)`` (``test_vlm_answer.eager_generate`` unless told)."""
    image, got = picture(), {}
    for kind in kinds:
        folder = tmp_path_factory.mktemp(kind)
        saved(kind, folder)
        got[kind] = (vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS),
                     *(reference or eager_generate)(folder, image))
    return got


def assert_answer_is_generates(answer, out, inputs) -> None:
    """vit's answer is ``generate``'s greedy answer token for token, more than one token long."""
    expected = answered_tokens(out, inputs)
    assert list(answer.tokens) == expected and len(expected) > 1


def assert_image_rows_are_eager(answer, out, inputs, image_token: int, atol: float = 1e-5) -> None:
    """The answer's image tokens are the prompt's ``image_token`` positions (more than one), and each answer token's
    row over them at every layer is the eager ``generate``'s (``test_vlm_answer.eager_image_rows``)."""
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions) and len(positions) > 1
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(),
                                       eager_image_rows(out, i, layer, positions), rtol=0, atol=atol)
