"""SAELens's TopK SAE, copied verbatim from sae-lens 6.54.12 (sae_lens/saes/topk_sae.py and sae_lens/saes/sae.py,
MIT licence in LICENSE beside this file): the TopK activation, encode / decode, process_sae_in, the weight
initialisation, the AuxK loss and the decoder-norm fold. sae-lens itself pulls transformer-lens, datasets, nltk and
plotly pins, so only these functions are vendored; ``ReferenceTopKSAE`` is the smallest shell they run in (the
HookPoints become identities, no activation normalisation, no hook_z reshaping). Tests only: ``vit/features/autoencoder.py``
is checked against it.
"""

from types import SimpleNamespace

import torch
from torch import nn


def override(f):
    return f


class TopK(nn.Module):
    """
    A simple TopK activation that zeroes out all but the top K elements along the last dimension,
    and applies ReLU to the top K elements.
    """

    use_sparse_activations: bool

    def __init__(
        self,
        k: int,
        use_sparse_activations: bool = False,
    ):
        super().__init__()
        self.k = k
        self.use_sparse_activations = use_sparse_activations

    def forward(
        self,
        x: torch.Tensor,
    ) -> torch.Tensor:
        """
        1) Select top K elements along the last dimension.
        2) Apply ReLU.
        3) Zero out all other entries.
        """
        topk_values, topk_indices = torch.topk(x, k=self.k, dim=-1, sorted=False)
        values = topk_values.relu()
        if self.use_sparse_activations:
            # Produce a COO sparse tensor (use sparse matrix multiply in decode)
            original_shape = x.shape

            # Create indices for all dimensions
            # For each element in topk_indices, we need to map it back to the original tensor coordinates
            batch_dims = original_shape[:-1]  # All dimensions except the last one
            num_batch_elements = torch.prod(torch.tensor(batch_dims)).item()

            # Create batch indices - each batch element repeated k times
            batch_indices_flat = torch.arange(
                num_batch_elements, device=x.device
            ).repeat_interleave(self.k)

            # Convert flat batch indices back to multi-dimensional indices
            if len(batch_dims) == 1:
                # 2D case: [batch, features]
                sparse_indices = torch.stack(
                    [
                        batch_indices_flat,
                        topk_indices.flatten(),
                    ]
                )
            else:
                # 3D+ case: need to unravel the batch indices
                batch_indices_multi = []
                remaining = batch_indices_flat
                for dim_size in reversed(batch_dims):
                    batch_indices_multi.append(remaining % dim_size)
                    remaining = remaining // dim_size
                batch_indices_multi.reverse()

                sparse_indices = torch.stack(
                    [
                        *batch_indices_multi,
                        topk_indices.flatten(),
                    ]
                )

            return torch.sparse_coo_tensor(
                sparse_indices, values.flatten(), original_shape
            )
        result = torch.zeros_like(x)
        result.scatter_(-1, topk_indices, values)
        return result



def _sparse_matmul_nd(
    sparse_tensor: torch.Tensor, dense_matrix: torch.Tensor
) -> torch.Tensor:
    """
    Multiply a sparse tensor of shape [..., d_sae] with a dense matrix of shape [d_sae, d_out]
    to get a result of shape [..., d_out].

    This function handles sparse tensors with arbitrary batch dimensions by flattening
    the batch dimensions, performing 2D sparse matrix multiplication, and reshaping back.
    """
    original_shape = sparse_tensor.shape
    batch_dims = original_shape[:-1]
    d_sae = original_shape[-1]
    d_out = dense_matrix.shape[-1]

    if sparse_tensor.ndim == 2:
        # Simple 2D case - use torch.sparse.mm directly
        # sparse.mm errors with bfloat16 :(
        with torch.autocast(device_type=sparse_tensor.device.type, enabled=False):
            return torch.sparse.mm(sparse_tensor, dense_matrix)

    # For 3D+ case, reshape to 2D, multiply, then reshape back
    batch_size = int(torch.prod(torch.tensor(batch_dims)).item())

    # Ensure tensor is coalesced for efficient access to indices/values
    if not sparse_tensor.is_coalesced():
        sparse_tensor = sparse_tensor.coalesce()

    # Get indices and values
    indices = sparse_tensor.indices()  # [ndim, nnz]
    values = sparse_tensor.values()  # [nnz]

    # Convert multi-dimensional batch indices to flat indices
    flat_batch_indices = torch.zeros_like(indices[0])
    multiplier = 1
    for i in reversed(range(len(batch_dims))):
        flat_batch_indices += indices[i] * multiplier
        multiplier *= batch_dims[i]

    # Create 2D sparse tensor indices [batch_flat, feature]
    sparse_2d_indices = torch.stack([flat_batch_indices, indices[-1]])

    # Create 2D sparse tensor
    sparse_2d = torch.sparse_coo_tensor(
        sparse_2d_indices, values, (batch_size, d_sae)
    ).coalesce()

    # sparse.mm errors with bfloat16 :(
    with torch.autocast(device_type=sparse_tensor.device.type, enabled=False):
        # Do the matrix multiplication
        result_2d = torch.sparse.mm(sparse_2d, dense_matrix)  # [batch_size, d_out]

    # Reshape back to original batch dimensions
    result_shape = tuple(batch_dims) + (d_out,)
    return result_2d.view(result_shape)


def act_times_W_dec(
    feature_acts: torch.Tensor,
    W_dec: torch.Tensor,
    rescale_acts_by_decoder_norm: bool,
) -> torch.Tensor:
    """
    Multiply feature activations by decoder weights, with optional decoder norm rescaling.

    Handles both dense and sparse tensors. Does NOT add b_dec — callers add it if needed.
    """
    if rescale_acts_by_decoder_norm:
        feature_acts = feature_acts * (1 / W_dec.norm(dim=-1))
    if feature_acts.is_sparse:
        return _sparse_matmul_nd(feature_acts, W_dec)
    return feature_acts @ W_dec



class ReferenceTopKSAE(nn.Module):
    """The attributes SAELens's methods below read, and nothing else."""

    def __init__(self, d_in, d_sae, k, apply_b_dec_to_input=True, rescale_acts_by_decoder_norm=False,
                 aux_loss_coefficient=1.0, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.cfg = SimpleNamespace(d_in=d_in, d_sae=d_sae, k=k, apply_b_dec_to_input=apply_b_dec_to_input,
                                   rescale_acts_by_decoder_norm=rescale_acts_by_decoder_norm,
                                   aux_loss_coefficient=aux_loss_coefficient, normalize_activations="none")
        self.dtype, self.device, self.d_head = dtype, device, None
        for name in ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons"):
            setattr(self, name, nn.Identity())
        self.reshape_fn_in = lambda x: x
        self.reshape_fn_out = lambda x, d_head: x
        self.run_time_activation_norm_fn_in = lambda x: x
        self.run_time_activation_norm_fn_out = lambda x: x
        self.activation_fn = TopK(k)
        self.initialize_weights()
        self.b_enc = nn.Parameter(torch.zeros(self.cfg.d_sae, dtype=self.dtype, device=self.device))

    def initialize_weights(self):
        """Initialize model weights."""
        self.b_dec = nn.Parameter(
            torch.zeros(self.cfg.d_in, dtype=self.dtype, device=self.device)
        )

        w_dec_data = torch.empty(
            self.cfg.d_sae, self.cfg.d_in, dtype=self.dtype, device=self.device
        )
        nn.init.kaiming_uniform_(w_dec_data)
        self.W_dec = nn.Parameter(w_dec_data)

        w_enc_data = self.W_dec.data.T.clone().detach().contiguous()
        self.W_enc = nn.Parameter(w_enc_data)


    def process_sae_in(self, sae_in: torch.Tensor) -> torch.Tensor:
        sae_in = sae_in.to(self.dtype)
        sae_in = self.reshape_fn_in(sae_in)

        sae_in = self.hook_sae_input(sae_in)
        sae_in = self.run_time_activation_norm_fn_in(sae_in)

        # Here's where the error happens
        bias_term = self.b_dec * self.cfg.apply_b_dec_to_input

        return sae_in - bias_term


    @override
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """
        Converts input x into feature activations.
        Uses topk activation under the hood.
        """
        sae_in = self.process_sae_in(x)
        hidden_pre = self.hook_sae_acts_pre(sae_in @ self.W_enc + self.b_enc)
        if self.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * self.W_dec.norm(dim=-1)
        # The base SAE already sets self.activation_fn to TopK(...) if config requests topk.
        return self.hook_sae_acts_post(self.activation_fn(hidden_pre))

    @override
    def decode(
        self,
        feature_acts: torch.Tensor,
    ) -> torch.Tensor:
        """
        Reconstructs the input from topk feature activations.
        Applies optional finetuning scaling, hooking to recons, out normalization,
        and optional head reshaping.
        """
        sae_out_pre = (
            act_times_W_dec(
                feature_acts, self.W_dec, self.cfg.rescale_acts_by_decoder_norm
            )
            + self.b_dec
        )
        sae_out_pre = self.hook_sae_recons(sae_out_pre)
        sae_out_pre = self.run_time_activation_norm_fn_out(sae_out_pre)
        return self.reshape_fn_out(sae_out_pre, self.d_head)


    def calculate_topk_aux_loss(
        self,
        sae_in: torch.Tensor,
        sae_out: torch.Tensor,
        hidden_pre: torch.Tensor,
        dead_neuron_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """
        Calculate TopK auxiliary loss.

        This auxiliary loss encourages dead neurons to learn useful features by having
        them reconstruct the residual error from the live neurons. It's a key part of
        preventing neuron death in TopK SAEs.
        """
        # Mostly taken from https://github.com/EleutherAI/sae/blob/main/sae/sae.py, except without variance normalization
        # NOTE: checking the number of dead neurons will force a GPU sync, so performance can likely be improved here
        if dead_neuron_mask is None or (num_dead := int(dead_neuron_mask.sum())) == 0:
            return sae_out.new_tensor(0.0)

        if self.cfg.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            raise ValueError(
                "TopK auxiliary loss does not support activation normalization "
                f"(normalize_activations={self.cfg.normalize_activations!r}). "
                "The aux loss reconstruction would be in normalized space while the "
                "residual is in the original space, producing incorrect gradients."
            )

        residual = (sae_in - sae_out).detach()

        # Heuristic from Appendix B.1 in the paper
        k_aux = sae_in.shape[-1] // 2

        # Reduce the scale of the loss if there are a small number of dead latents
        scale = min(num_dead / k_aux, 1.0)
        k_aux = min(k_aux, num_dead)

        auxk_acts = calculate_topk_aux_acts(
            k_aux=k_aux,
            hidden_pre=hidden_pre,
            dead_neuron_mask=dead_neuron_mask,
        )

        # Encourage the top ~50% of dead latents to predict the residual of the
        # top k living latents. Per the paper (Appendix A.2), the reconstruction
        # is ê = W_dec @ z (no bias), since b_dec is already in the residual.
        recons = act_times_W_dec(
            auxk_acts, self.W_dec, self.cfg.rescale_acts_by_decoder_norm
        )
        # Apply the same reshaping as decode() so recons matches the residual's shape
        recons = self.reshape_fn_out(recons, self.d_head)
        auxk_loss = (recons - residual).pow(2).sum(dim=-1).mean()
        return self.cfg.aux_loss_coefficient * scale * auxk_loss



def calculate_topk_aux_acts(
    k_aux: int,
    hidden_pre: torch.Tensor,
    dead_neuron_mask: torch.Tensor,
) -> torch.Tensor:
    """
    Helper method to calculate activations for the auxiliary loss.

    Args:
        k_aux: Number of top dead neurons to select
        hidden_pre: Pre-activation values from encoder
        dead_neuron_mask: Boolean mask indicating which neurons are dead

    Returns:
        Tensor with activations for only the top-k dead neurons, zeros elsewhere
    """

    # Don't include living latents in this loss
    auxk_latents = torch.where(dead_neuron_mask[None], hidden_pre, -torch.inf)
    # Top-k dead latents
    auxk_topk = auxk_latents.topk(k_aux, sorted=False)
    # Set the activations to zero for all but the top k_aux dead latents
    auxk_acts = torch.zeros_like(hidden_pre)
    auxk_acts.scatter_(-1, auxk_topk.indices, auxk_topk.values)
    # Set activations to zero for all but top k_aux dead latents
    return auxk_acts



def _fold_norm_topk(
    W_dec_norm: torch.Tensor,
    W_enc: torch.Tensor,
    b_enc: torch.Tensor,
    W_dec: torch.Tensor,
) -> None:
    b_enc.data = b_enc.data * W_dec_norm
    W_dec_norms = W_dec_norm.unsqueeze(1)
    W_dec.data = W_dec.data / W_dec_norms
    W_enc.data = W_enc.data * W_dec_norms.T
