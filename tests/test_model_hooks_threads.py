"""A model is every session's (one cached object), and a hook a computation puts on one of its modules fired in
every thread's forward while it was there: one visitor's ablation edited another's forward at the same moment.
``vit.core.threads.this_thread_only`` keeps each such hook to the thread that set it."""

import threading

import pytest
import torch

from vit.core.threads import this_thread_only


def test_a_guarded_hook_edits_the_forwards_of_its_own_thread_only():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad():
        plain = layer(x)
    handle = layer.register_forward_hook(this_thread_only(lambda module, args, output: output * 2))
    try:
        with torch.no_grad():
            own = layer(x)
            other = []
            thread = threading.Thread(target=lambda: other.append(layer(x)))
            thread.start()
            thread.join(10)
    finally:
        handle.remove()
    torch.testing.assert_close(own, plain * 2, rtol=0, atol=0)
    torch.testing.assert_close(other[0], plain, rtol=0, atol=0)  # the hook's thread alone


transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, picture, saved_whole  # noqa: E402

import vit  # noqa: E402


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return saved_whole(tmp_path_factory, ("llava",))["llava"]


@pytest.mark.slow
def test_an_ablation_running_leaves_another_threads_forward_of_the_same_model_as_it_was(llava):
    """Visitor A ablates the image's tokens of an answer (``VLMAnswer.ablate``: a hook on the language model that
    zeroes them in its input) while visitor B's forward of the same language model runs: B's output is what it is
    alone. It was B's input with A's positions zeroed."""
    answer = vit.ask_vlm(llava, picture(), QUESTION, max_new_tokens=3)
    vlm, _ = answer._model()
    language = vlm.language_model
    torch.manual_seed(0)
    embeds = torch.randn(1, 64, language.get_input_embeddings().embedding_dim)  # B's own input, long enough
    with torch.inference_mode():
        alone = language(inputs_embeds=embeds).last_hidden_state
    ablator, seen = threading.current_thread(), []

    def meanwhile(module, args, kwargs):  # in A's ablated forward (its hook is on): B runs one forward, whole
        if threading.current_thread() is ablator and len(language._forward_pre_hooks) > 1 and not seen:
            def visitor():
                with torch.inference_mode():
                    seen.append(language(inputs_embeds=embeds).last_hidden_state)
            other = threading.Thread(target=visitor)
            other.start()
            other.join(60)
        return None

    handle = language.register_forward_pre_hook(meanwhile, with_kwargs=True)
    try:
        answer.ablate(1, (0, 0, *answer.grid))
    finally:
        handle.remove()
    assert seen, "B's forward ran while A's ablation hook was on the model"
    torch.testing.assert_close(seen[0], alone, rtol=0, atol=0)
