"""Writes architectures_reference.py: named functions and classes pulled verbatim out of the sae-lens wheel.

    pip download sae-lens==6.54.12 --no-deps -d /tmp/sl && unzip /tmp/sl/*.whl -d /tmp/sl/x
    python extract.py /tmp/sl/x/sae_lens/saes/ > architectures_reference.py
"""

import ast
import sys
import textwrap

ROOT = sys.argv[1]


def s(file, qualname, indent=""):
    """The source of ``qualname`` (decorators included) in ``ROOT/file``, re-indented by ``indent``."""
    src = open(ROOT + file).read()
    lines = src.splitlines()
    body, node = ast.parse(src).body, None
    for part in qualname.split("."):
        node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
        body = node.body
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return textwrap.indent(textwrap.dedent("\n".join(lines[start:node.end_lineno])), indent)


I = "    "
parts = [
'''"""SAELens's JumpReLU, gated and standard SAEs and the BatchTopK / Matryoshka-BatchTopK training SAEs' inference
form, copied verbatim from sae-lens 6.54.12 (the PyPI wheel sae_lens-6.54.12-py3-none-any.whl; MIT licence in LICENSE
beside this file) by tests/reference/sae_lens/extract.py, which pulls each function's source out of the wheel
unchanged: sae_lens/saes/sae.py (``initialize_weights``, ``process_sae_in``, ``get_W_dec_norm``,
``TrainingSAE.process_state_dict_for_saving_inference``), jumprelu_sae.py, gated_sae.py and standard_sae.py
(``initialize_weights``, ``encode``, ``decode``, the ``_init_weights_*`` helpers), topk_sae.py
(``TopKTrainingSAE.process_state_dict_for_saving_inference``, ``_init_weights_topk``, ``_fold_norm_topk``) and
batchtopk_sae.py (``BatchTopK``, ``BatchTopKTrainingSAE.process_state_dict_for_saving_inference``).
Matryoshka-BatchTopK adds only training losses to BatchTopK (its ``MatryoshkaBatchTopKTrainingSAE`` overrides no
inference or saving method), so its inference form is BatchTopK's.

sae-lens itself imports transformer-lens (and through it datasets, nltk and plotly pins) at ``import sae_lens``, so
only these functions are vendored; ``_Shell`` is the smallest class they run in (the HookPoints become identities, no
activation normalisation, no hook_z reshaping). Tests only: ``vit/features/autoencoder.py`` is checked against it.
"""

from __future__ import annotations  # the helpers' hints name sae-lens classes not copied here

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn


def override(f):
    return f


''',
s("batchtopk_sae.py", "BatchTopK"), "\n\n",
s("standard_sae.py", "_init_weights_standard"), "\n\n",
s("gated_sae.py", "_init_weights_gated"), "\n\n",
s("topk_sae.py", "_init_weights_topk"), "\n\n",
s("topk_sae.py", "_fold_norm_topk"), "\n\n",
'''class _Shell(nn.Module):
    """The attributes SAELens's methods below read, and nothing else (``SAE.__init__`` without the HookPoints)."""

    def __init__(self, d_in, d_sae, apply_b_dec_to_input=True, dtype=torch.float32, device="cpu", **cfg):
        super().__init__()
        self.cfg = SimpleNamespace(d_in=d_in, d_sae=d_sae, apply_b_dec_to_input=apply_b_dec_to_input,
                                   normalize_activations="none", **cfg)
        self.dtype, self.device, self.d_head = dtype, torch.device(device), None
        for name in ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"):
            setattr(self, name, nn.Identity())
        self.reshape_fn_in = lambda x: x
        self.reshape_fn_out = lambda x, d_head: x
        self.run_time_activation_norm_fn_in = lambda x: x
        self.run_time_activation_norm_fn_out = lambda x: x
        self.activation_fn = self.get_activation_fn()
        self.initialize_weights()

    def get_activation_fn(self):
        """Get the activation function specified in config."""
        return nn.ReLU()

''',
s("sae.py", "SAE.initialize_weights", I), "\n\n",
s("sae.py", "SAE.process_sae_in", I), "\n\n",
s("sae.py", "SAE.get_W_dec_norm", I), "\n\n",
s("sae.py", "SAE.process_state_dict_for_saving", I), "\n\n\n",
"class ReferenceStandardSAE(_Shell):\n",
s("standard_sae.py", "StandardSAE.initialize_weights", I), "\n\n",
s("standard_sae.py", "StandardSAE.encode", I), "\n\n",
s("standard_sae.py", "StandardSAE.decode", I), "\n\n\n",
"class ReferenceJumpReLUSAE(_Shell):\n",
s("jumprelu_sae.py", "JumpReLUSAE.initialize_weights", I), "\n\n",
s("jumprelu_sae.py", "JumpReLUSAE.encode", I), "\n\n",
s("jumprelu_sae.py", "JumpReLUSAE.decode", I), "\n\n\n",
"class ReferenceGatedSAE(_Shell):\n",
s("gated_sae.py", "GatedSAE.initialize_weights", I), "\n\n",
s("gated_sae.py", "GatedSAE.encode", I), "\n\n",
s("gated_sae.py", "GatedSAE.decode", I), "\n\n\n",
"class _TrainingShell(_Shell):\n",
s("sae.py", "TrainingSAE.process_state_dict_for_saving_inference", I), "\n\n\n",
"class _TopKTrainingShell(_TrainingShell):\n",
s("topk_sae.py", "TopKTrainingSAE.initialize_weights", I), "\n\n",
s("topk_sae.py", "TopKTrainingSAE.encode_with_hidden_pre", I), "\n\n",
s("topk_sae.py", "TopKTrainingSAE.process_state_dict_for_saving_inference", I), "\n\n\n",
'''class ReferenceBatchTopKTrainingSAE(_TopKTrainingShell):
    """A BatchTopK (or Matryoshka-BatchTopK) training SAE's state: its weights, ``k`` and ``topk_threshold``."""

    def __init__(self, d_in, d_sae, k, rescale_acts_by_decoder_norm=True, **cfg):
        super().__init__(d_in, d_sae, k=k, rescale_acts_by_decoder_norm=rescale_acts_by_decoder_norm, **cfg)
        self.register_buffer(
            "topk_threshold",
            # use double precision as otherwise we can run into numerical issues
            torch.tensor(0.0, dtype=torch.double, device=self.W_dec.device),
        )

    def get_activation_fn(self):
        return BatchTopK(self.cfg.k)

''',
s("batchtopk_sae.py", "BatchTopKTrainingSAE.process_state_dict_for_saving_inference", I), "\n",
]
text = "".join(parts)
sys.stdout.write(text)
