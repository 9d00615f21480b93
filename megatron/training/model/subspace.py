"""Subspace Networks: k numbers per token across a pipeline boundary, by constraining the model.

After "Protocol Models: Scaling Decentralized Training with Communication-Efficient Model
Parallelism" (Ramasinghe et al., arXiv 2506.01260, NeurIPS 2025). Flags:
`--forward-compress-method subspace [--subspace-rank K] [--subspace-bits B]`, and
`--subspace-rank K` alone for the same model without the coefficient wire (pp 1 included).

The model
---------
The residual stream of a pre-LN GPT is x_L = x0 + sum over blocks of what each block writes:
x0 = E[token] + P[position] (the embedding), and every write is an output projection, the
attention's linear_proj and the MLP's linear_fc2 (plus their biases). Here every one of those
writes is projected onto one k-dim subspace spanned by the orthonormal columns of U (H x k),
shared by all layers and stages:

    W_out,eff = U U^T W_out,      b_out,eff = U U^T b_out

So x_l - x0 lies in span(U) after every block, on every stage, and a stage boundary can carry
the coefficients c = U^T (x - x0), (S, B, k), instead of x, (S, B, H); the next stage rebuilds
x = x0 + U c, computing x0 itself from the token ids (the data loader serves every stage the
micro-batch's tokens and positions, not only the first and last: a small hook in
training.StageStep). Gradients: the receiver's input is c, so what autograd sends back is
dL/dc = U^T dL/dx, k values per token -- not an approximation of the gradient but the gradient
of the constrained model itself (tests/training/test_subspace.py checks pp=2 against pp=1).

Parametrisation. The paper constrains the projection weights to the subspace; we write it as
W_eff = a U U^T W with W the ordinary full parameter (the projection is applied to the layer's
output, (out U) U^T, which equals using W_eff and costs 4 S B H k flops instead of H^2 x in):
parameter names, shapes, tp sharding, the seed-keyed initialisation and every checkpoint tool
stay as they are, and export only has to write a U U^T W (tools/checkpoint/subspace_hf.py).
Its gradient, U U^T dL/dW_eff, lies in the subspace; Adam's per-element scaling moves W off
it, but only U U^T W is ever used, and weight decay shrinks the unused part. The equivalent
W = U B with B (k x in) trainable has the same function class; we take the form that keeps
megatron-core's layers untouched.

The write scale a (--subspace-write-scale, default sqrt(k / H)). A write of a given norm that
lies in k of the H directions is sqrt(H / k) times larger per direction than one spread over
all of them, and at a = 1 the constrained model starts with, and Adam keeps, writes of the
unconstrained model's norm concentrated in k directions, against an embedding spread over H.
a = sqrt(k / H) gives each subspace direction the size an unconstrained write gives each of
its directions; smaller scales train closer to the unconstrained model than a = 1 does (the
sweep: docs/subspace.md, "The write scale"). a is a persistent buffer
(subspace_write_scale, fp32 like U): a checkpoint keeps its own, one saved before it existed
loads with a = 1 (fill_old_state), export multiplies it in, import divides the weights by it.

The subspace U. Fixed, as in the paper, which "predefine[s] a low-dimensional subspace to
confine the activations and gradients" (abstract): drawn from a generator keyed by (--seed,
"subspace.U"), a Gaussian H x k orthonormalised by QR (signs fixed), identical on every rank
with no communication, kept in fp32 whatever the training dtype, and saved with the model (a
buffer in the state dict, so an imported model's U -- chosen from its weights -- travels with
its checkpoints). Not learned and not re-orthonormalised (nothing changes it): a learned U
would change the meaning of the coefficients every step and need its own synchronisation. The
paper's argument that a fixed subspace costs little is the rank collapse of the projection
weights it observes under AdamW with decoupled weight decay; what it costs here is in
docs/subspace.md (bench/bench_subspace.py).

The embedding. The paper takes the token and position embeddings out of what is confined (its
residual is the layer output minus PE and TE) and has each stage rebuild them locally, from the
token ids it can see. Here the embedding stays an
ordinary trainable parameter, replicated: stage 0 has megatron-core's own, every other stage a
copy (`x0_embedding`, same global names, so the same initial values). Exactness of its
gradient: x0 enters the loss on every stage that rebuilds it (stage s's blocks read x0 + U c),
so dL/dE = sum over stages of each stage's local dL/dE (on stage 0 the direct path x0 -> x ->
c = U^T (x - x0) cancels, and only what its blocks read of x0 counts). After backward, the
copies' gradients are summed over the pipeline group (all stages of one replica and tp rank;
megatron/cc/embedding/replica_embedding.py) and written into every copy, so every copy takes
the same step. With tied embeddings the last stage first adds its copy's gradient into the
output weight's, so Megatron's usual first + last emb sum carries both of its uses; at pp 2
that sum is then already the whole word gradient and no second all-reduce is made. What
crosses stages once per iteration, on the log line's `emb` channel (honest bytes, amortised
over the iteration's micro-batches): at pp 2 tied, Megatron's own word sum plus the position
table (positions x H); otherwise also the word table's V/tp x H sum over all stages.
The copies are marked `shared` so the grad
norm counts the embedding once.

What must hold, and is refused otherwise (validate): --hidden-dropout 0 (dropout on a write,
or on x0, moves it off the subspace and makes x0 unrebuildable); no --sequence-parallel (the
stage boundary would be the rank's sequence shard: not done yet); no interleaving; no other
backward codec (the backward partner is the subspace codec itself); pp > 1 for the codec.
With tp > 1 every tp rank computes the same c and, with scatter-gather (the default), sends
its 1/tp slice of the sequence: each rank's share of the coefficients.

Bytes: forward and backward messages are (S/tp, B, k), in the pipeline dtype at
--subspace-bits 0, else k b-bit codes per token plus k 16-bit scales per message. Against
fp32 (S, B, H): ratio ~ 32 H / (bits k) per direction, e.g. H 128, k 10, 4 bits -> x100.8
(scales included, S B / tp = 256 tokens per message: the demo's shape).
"""
import hashlib
import math
from typing import Tuple

import torch

from megatron.core.models.common.embeddings.language_model_embedding import (
    LanguageModelEmbedding)
from megatron.core.models.gpt import GPTModel

# the flag helpers live apart so that checking the flags needs no megatron-core import
from megatron.training.model.subspace_flags import (  # noqa: F401  (re-exported)
    bits, constrains_writes, pipeline_width, rank, sends_coefficients, validate, write_scale)

WRITE_SCALE = "subspace_write_scale"   # the buffer holding a (module docstring)


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
    """megatron-core's GPTModel with its residual writes in span(U) (module docstring).

    `constrain` finishes construction (U, the projections, the x0 copy). With
    `sends_coefficients` the stage takes (S, B, k) coefficients in (set_input_tensor) and gives
    (S, B, k) out (non-last stages); otherwise it is the ordinary stage interface.
    """

    def constrain(self, k: int, seed: int, sends_coefficients: bool, scale: float,
                  writes: bool = True) -> None:
        h = self.config.hidden_size
        # saved with the model: an imported model's U is chosen from its weights
        self.register_buffer("subspace_basis", basis(seed, h, k), persistent=True)
        self.register_buffer(WRITE_SCALE, torch.tensor(float(scale)), persistent=True)
        self.sends_coefficients = sends_coefficients
        self._coefficients = None
        for layer in self.decoder.layers if writes else ():   # boundary: forward projects
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
        """U stays fp32 whatever the training dtype: in bf16 its columns would be orthonormal
        to ~1e-2 only, and U^T U != I would make the receiver's x0 + U c differ from the
        sender's x by that much. Device moves apply; dtype casts do not."""
        kept = {n: self._buffers.get(n) for n in ("subspace_basis", WRITE_SCALE)}
        super()._apply(fn, recurse)
        for n, b in kept.items():
            if b is not None:
                self._buffers[n] = b.to(fn(b).device)
        return self

    def _project_write(self, module, inputs, output):
        """A block's write (out, bias) -> (a out U U^T, a U U^T bias): out of a linear, so this
        is the layer with W_eff = a U U^T W. Runs before the tp channel's sum of partial outputs
        (hooks in registration order): the projection is linear, the sum the same. In fp32
        (no-op casts when training in fp32)."""
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
            self.decoder.set_input_tensor(x0 + (self._coefficients.float() @ u.t()).to(x0.dtype))
        out = super().forward(input_ids, position_ids, attention_mask,
                              decoder_input=decoder_input, labels=labels, **kwargs)
        if self.post_process:
            return out
        # (S, B, k): what crosses to the next stage, in the pipeline dtype
        return ((out - x0).float() @ u).to(out.dtype)


def gpt_class(args):
    """The model class _build_chunk constructs."""
    return GPTModel if rank(args) is None else SubspaceGPTModel


def constrain(model, args) -> None:
    """Finish a SubspaceGPTModel (before the seed-keyed init: the x0 copy is initialised with
    the embedding's values by its global name)."""
    if isinstance(model, SubspaceGPTModel):
        model.constrain(rank(args), args.training.seed, sends_coefficients(args),
                        write_scale(args), constrains_writes(args))


def fill_old_state(saved: dict, expected: dict) -> None:
    """A subspace checkpoint saved before the write scale existed was trained with a = 1: give
    it that, so it loads (strictly) and keeps computing what it did."""
    for key in expected:
        if key.endswith(WRITE_SCALE) and key not in saved and \
                key[:-len(WRITE_SCALE)] + "subspace_basis" in saved:
            saved[key] = torch.ones((), dtype=torch.float32)


def global_name(name: str) -> str:
    """The x0 copy's parameters are the embedding's: same global name, same values."""
    return "embedding." + name[len("x0_embedding."):] if name.startswith("x0_embedding.") \
        else name


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
