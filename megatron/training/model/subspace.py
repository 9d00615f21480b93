"""Subspace Networks (Protocol Models, arXiv 2506.01260): k numbers per token across a
pipeline boundary, by constraining the model.

Every attention and MLP output projection writes into span(U), U (H, k) fixed and orthonormal:
W_eff = a U U^T W. A stage boundary then carries c = U^T (x - x0), (S, B, k); the next stage
rebuilds x = x0 + U c from its own copy of the embedding, and the gradient sent back, U^T dL/dx,
is the constrained model's exact gradient. The write scale a (default sqrt(k / H)) gives each
subspace direction the size an unconstrained write gives each of its own; it is saved with the
model. With --subspace-constrain boundary (the method's default) no write is confined and only
the stage output is projected; learned trains the sender's encoder and the receiver's decoder
in place of U. Flags, constraints and design: docs/subspace.md.
"""
import hashlib
import math
from typing import Tuple

import torch

from megatron.core.models.common.embeddings.language_model_embedding import (
    LanguageModelEmbedding)
from megatron.core.models.gpt import GPTModel
from megatron.cc.pipeline.subspace import saved_constrain_mode

# the flag helpers live apart so that checking the flags needs no megatron-core import
from megatron.training.model.subspace_flags import (  # noqa: F401  (re-exported)
    bits, constrain_kind, constrains_writes, pipeline_width, rank, sends_coefficients, validate,
    write_scale)

WRITE_SCALE = "subspace_write_scale"   # the buffer holding the write scale a


# --------------------------------------------------------------------------- the model

def basis(seed: int, hidden: int, k: int) -> torch.Tensor:
    """U (H, k), orthonormal columns, a function of (seed, H, k) only: every rank draws the same."""
    # keyed like model.py's initial weights, (seed, name), but not imported from there:
    # model.py builds this module's class (one import direction)
    digest = hashlib.sha256(f"{seed}/subspace.U".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    g = torch.randn(hidden, k, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r))   # QR's signs made unique: same U on any LAPACK
    return q.float()


class SubspaceGPTModel(GPTModel):
    """megatron-core's GPTModel with its residual writes in span(U).

    `constrain` finishes construction (U, the projections, the x0 copy). With
    `sends_coefficients` the stage takes (S, B, k) coefficients in (set_input_tensor) and gives
    (S, B, k) out (non-last stages); otherwise it is the ordinary stage interface.
    """

    def constrain(self, k: int, seed: int, sends_coefficients: bool, scale: float,
                  mode: str = "writes") -> None:
        h = self.config.hidden_size
        # saved with the model: an imported model's U is chosen from its weights
        u = basis(seed, h, k)
        self.register_buffer("subspace_basis", u, persistent=True)
        # learned: the sender's encoder and the receiver's decoder are this stage's own
        # parameters (nothing to synchronise); both start at U, i.e. at the boundary model
        learned = mode == "learned"
        self.subspace_encoder = torch.nn.Parameter(u.clone()) \
            if learned and not self.post_process else None
        self.subspace_decoder = torch.nn.Parameter(u.clone()) \
            if learned and not self.pre_process else None
        self.register_buffer(WRITE_SCALE, torch.tensor(float(scale)), persistent=True)
        self.constrain_mode = mode
        self.sends_coefficients = sends_coefficients
        self._coefficients = None
        for layer in self.decoder.layers if mode == "writes" else ():   # else forward projects
            for proj in (layer.self_attention.linear_proj, layer.mlp.linear_fc2):
                proj.register_forward_hook(self._project_write)
        if sends_coefficients and not self.pre_process:
            # this stage's copy of the embedding, rebuilt x0 (global names: embedding.*)
            self.x0_embedding = LanguageModelEmbedding(
                config=self.config, vocab_size=self.vocab_size,
                max_sequence_length=self.max_sequence_length,
                position_embedding_type=self.position_embedding_type)
            for p in self.x0_embedding.parameters():
                p.shared = True   # the grad norm counts stage 0's copy only

    def _apply(self, fn, recurse=True):
        """U and a stay fp32 whatever the training dtype (in bf16, U^T U != I would make the
        receiver's x0 + U c differ from the sender's x). Device moves apply; dtype casts do not."""
        kept = {n: self._buffers.get(n) for n in ("subspace_basis", WRITE_SCALE)}
        super()._apply(fn, recurse)
        for n, b in kept.items():
            if b is not None:
                self._buffers[n] = b.to(fn(b).device)
        return self

    def _project_write(self, module, inputs, output):
        """A block's write (out, bias) -> (a out U U^T, a U U^T bias), i.e. the layer with
        W_eff = a U U^T W; computed in fp32. Runs before the tp channel's sum of partial
        outputs, which is linear, so the sum is the same."""
        u, a = self.subspace_basis, self.subspace_write_scale
        out, bias = output
        out = (((out.float() @ u) * a) @ u.t()).to(out.dtype)
        if bias is not None:
            bias = (u @ ((u.t() @ bias.float()) * a)).to(bias.dtype)
        return out, bias

    def set_input_tensor(self, input_tensor) -> None:
        if not self.sends_coefficients:
            return super().set_input_tensor(input_tensor)
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self._coefficients = input_tensor   # (S, B, k); expanded in forward, where x0 is known

    def forward(self, input_ids, position_ids, attention_mask, decoder_input=None,
                labels=None, **kwargs):
        if not self.sends_coefficients:
            return super().forward(input_ids, position_ids, attention_mask,
                                   decoder_input=decoder_input, labels=labels, **kwargs)
        u = self.subspace_basis
        embed = self.embedding if self.pre_process else self.x0_embedding
        x0 = embed(input_ids=input_ids, position_ids=position_ids)   # (S, B, H)
        if self.pre_process:
            decoder_input = x0
        else:
            d = u if self.subspace_decoder is None else self.subspace_decoder.float()
            self.decoder.set_input_tensor(x0 + (self._coefficients.float() @ d.t()).to(x0.dtype))
        out = super().forward(input_ids, position_ids, attention_mask,
                              decoder_input=decoder_input, labels=labels, **kwargs)
        if self.post_process:
            return out
        # (S, B, k): what crosses to the next stage, in the pipeline dtype
        e = u if self.subspace_encoder is None else self.subspace_encoder.float()
        return ((out - x0).float() @ e).to(out.dtype)


def gpt_class(args):
    """The model class _build_chunk constructs."""
    return GPTModel if rank(args) is None else SubspaceGPTModel


def constrain(model, args) -> None:
    """Finish a SubspaceGPTModel (before the seed-keyed init: the x0 copy is initialised with
    the embedding's values by its global name)."""
    if isinstance(model, SubspaceGPTModel):
        model.constrain(rank(args), args.training.seed, sends_coefficients(args),
                        write_scale(args), constrain_kind(args))


def fill_old_state(saved: dict, expected: dict) -> None:
    """A subspace checkpoint without a saved write scale was trained with a = 1: give it that,
    so it loads strictly and computes what it did."""
    for key in expected:
        if key.endswith(WRITE_SCALE) and key not in saved and \
                key[:-len(WRITE_SCALE)] + "subspace_basis" in saved:
            saved[key] = torch.ones((), dtype=torch.float32)


def check_saved_mode(model, saved_args: dict) -> None:
    """A checkpoint of one --subspace-constrain loads into a model of another without a tensor
    to tell (writes and boundary hold the same ones): refuse it by name."""
    saved = (saved_args or {}).get("compression") or {}
    if not isinstance(model, SubspaceGPTModel) or (
            saved.get("subspace_rank") is None and
            saved.get("forward_compress_method") != "subspace"):
        return
    mode = saved_constrain_mode(saved)
    if mode != model.constrain_mode:
        raise ValueError(f"the checkpoint was trained with --subspace-constrain {mode}, these "
                         f"flags build {model.constrain_mode} (the default is boundary with "
                         f"--forward-compress-method subspace, writes without it): give "
                         f"--subspace-constrain {mode}")


def global_name(name: str, layers_before: int = 0, local_layers: int = 0) -> str:
    """The x0 copy's parameters are the embedding's: same global name, same values. A learned
    boundary's encoder and decoder are named after the boundary: the number of layers before it
    (the stage's first layer for a decoder, after its last one for an encoder)."""
    if name.startswith("x0_embedding."):
        return "embedding." + name[len("x0_embedding."):]
    if name == "subspace_decoder":
        return f"subspace_boundary.{layers_before}.decoder"
    if name == "subspace_encoder":
        return f"subspace_boundary.{layers_before + local_layers}.encoder"
    return name


def initial_value(gname: str, shape, seed: int):
    """A learned boundary's encoder / decoder start at U (the fixed boundary's model); None for
    every other parameter."""
    if gname.startswith("subspace_boundary."):
        return basis(seed, *shape)
    return None


# --------------------------------------------------------------------------- gradient sync

def embedding_tables(model, pp: int, dp_group=None):
    """This stage's replicated tables (word, positions) for ReplicaEmbeddingSync."""
    from megatron.cc.embedding.replica_embedding import LookedUpRows, ReplicaTable
    if not getattr(model, "sends_coefficients", False):
        return []
    embed = model.embedding if model.pre_process else model.x0_embedding
    tied = model.share_embeddings_and_output_weights
    fold = model.output_layer.weight if tied and model.post_process else None
    # tied: the output layer's gradient is dense (every stage must agree: tied is global);
    # at pp 2 the emb channel's first + last sum is already the whole word gradient
    rows = None if tied else LookedUpRows(embed.word_embeddings, dp_group)
    tables = [ReplicaTable(embed.word_embeddings.weight, fold, allreduce=not (tied and pp == 2),
                           rows=rows)]
    if getattr(embed, "add_position_embedding", False):
        tables.append(ReplicaTable(embed.position_embeddings.weight))
    return tables


def wrap_emb_channel(args, emb, model, topo, stats):
    """The emb channel with the x0 copies' gradients summed over the stages."""
    if not sends_coefficients(args):
        return emb
    from megatron.cc.embedding.replica_embedding import ReplicaEmbeddingSync
    from megatron.cc.grad_sync.sync import unwrap
    return ReplicaEmbeddingSync(emb, topo.pp_group, stats,
                                embedding_tables(unwrap(model), args.pp, topo.dp_group))


def expected_bytes_per_message(args) -> Tuple[int, int]:
    """(bytes on the wire, uncompressed fp32-equivalent bytes) of one pipeline message of
    one tp rank, in the pipeline dtype: the formula the log line must match."""
    from megatron.cc.numerics.quant import packed_nbytes
    s, b, h, k = args.pipeline_seq_length, args.training.micro_batch_size, \
        args.model.hidden_size, rank(args)
    elem = 2 if (args.model.bf16 or args.model.fp16) else 4
    n = bits(args)
    sent = s * b * k * elem if n == 0 else packed_nbytes(s * b * k, n) + 2 * k
    return sent, s * b * h * elem


def ratio(hidden: int, k: int, n_bits: int, tokens: int) -> float:
    """fp32 (tokens, H) over (tokens, k) coefficients at n_bits (0: fp32), scales included."""
    sent = tokens * k * 4 if n_bits == 0 else math.ceil(tokens * k * n_bits / 8) + 2 * k
    return tokens * hidden * 4 / sent
