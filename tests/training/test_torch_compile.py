"""--torch-compile (megatron/training/model/compiled.py): every megatron-core transformer layer
compiled in place gives the eager model's logits and gradients, with the parameter names (and
so the checkpoints) unchanged. On the CPU with torch.compile's aot_eager backend, which traces
the layers as inductor does (dynamo, AOT autograd) without generating code; the GPU tests and
bench/bench_gpu.py run inductor itself."""
import torch

from tests.distributed import run_distributed

TOL = 1e-5


def _logits_and_grads(rank, world, compiled):
    from megatron.core import parallel_state as ps
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.model.compiled import compile_layers
    from megatron.training.model.model import build_gpt_model, transformer_config
    args = parse_args(["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4",
                       "--seq-length", "32", "--attention-dropout", "0", "--hidden-dropout",
                       "0", "--transformer-impl", "sdpa"]
                      + (["--torch-compile"] if compiled else []), world_size=world)
    topo = initialize_distributed(args)
    try:
        model = build_gpt_model(args, transformer_config(args), 256, topo)
        n = compile_layers(model, backend="aot_eager") if args.gpu.torch_compile else 0
        out = []
        for seed in (1, 2):   # a second call: the compiled code is reused
            tokens = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(seed))
            logits = model(tokens, torch.arange(32).expand_as(tokens), None)
            logits.float().pow(2).mean().backward()
            out.append(logits.detach())
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        ps.destroy_model_parallel()
        torch._dynamo.reset()
    return out, grads, n, frames


def _both(rank, world):
    return [_logits_and_grads(rank, world, c) for c in (False, True)]


def test_compiled_layers_match_eager_ones():
    (ref, ref_grads, _, _), (out, grads, n, graphs) = run_distributed(_both, 1, timeout=600)[0]
    assert n == 3 and graphs >= 1
    assert grads.keys() == ref_grads.keys()          # the names a checkpoint stores
    for a, b in zip(out, ref):
        assert (a - b).abs().max() <= TOL * b.abs().max()
    for k in grads:
        g, r = grads[k], ref_grads[k]
        assert (g - r).abs().max() <= TOL * max(r.abs().max(), 1e-12), k


def _train(rank, world, argv):
    from tests.training.runner import train_counting_graphs
    return train_counting_graphs(argv, world)


def test_trainer_with_torch_compile_trains_like_eager(tiny_corpus):
    """pretrain_gpt.py's --torch-compile through the Trainer, inductor (C++ on the CPU), sdpa
    layers, no dropout: the eager losses to float tolerance."""
    from tests.conftest import tiny_gpt_argv
    argv = tiny_gpt_argv(tiny_corpus, **{"num-layers": 2, "train-iters": 3,
                                         "transformer-impl": "sdpa"})
    eager, none = run_distributed(_train, 1, (argv,), timeout=600)[0]
    compiled, graphs = run_distributed(_train, 1, (argv + ["--torch-compile"],), timeout=600)[0]
    # the flag compiled the layers (on GPUs megatron-core compiles its own fused bias-GeLU
    # and bias-dropout-add in both runs)
    assert graphs > none
    assert len(compiled) == 3
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(compiled, eager)), (compiled, eager)
