"""CB inside the real pipeline (pp=2, dp=2): exact at full rank, byte-exact and training when lossy.

- rank >= min(n, m): the codec sends the matrix itself, so losses equal the uncompressed run's
  to float rounding ("identity compression gives exactly the uncompressed loss");
- rank 2 with LEP (flushed into uncompressed sends), 2 power steps, epilogue-only: pp-bwd bytes per iteration are exactly
  (#critical sends) x r(n+m) x 4 + (#other sends) x n*m*4, and the model still trains;
- the LEP error buffer and Q are in the checkpoint and come back on load.
"""
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

S, B, H = 32, 1, 32     # seq, micro-batch, hidden of tiny_gpt_argv
M = 4                   # global 8 / (micro 1 x dp 2)


def _worker(rank, world, corpus):
    base = {"pipeline-model-parallel-size": 2, "train-iters": 4}
    plain = runner.train(tiny_gpt_argv(corpus, **base), world)
    full_rank = runner.train(tiny_gpt_argv(corpus, **base, **{
        "inter-grad-comp": True, "inter-grad-comp-rank": 64}), world)
    lossy, bwd_bytes = runner.train_with_stats(tiny_gpt_argv(corpus, **{
        "pipeline-model-parallel-size": 2, "inter-grad-comp": True, "inter-grad-comp-rank": 2, "use-error-feedback": True,
        "inter-grad-comp-epilogue-only": True, "lep-flush-on-uncompressed": True,
        "inter-grad-comp-power-iters": 2, "train-iters": 12}), world, "pp-bwd")
    return plain, full_rank, lossy, bwd_bytes


def test_cb_in_pipeline(tiny_corpus):
    plain, full_rank, lossy, bwd_bytes = run_distributed(_worker, 4, (tiny_corpus,),
                                                         timeout=600)[-1]
    for a, b in zip(plain, full_rank):
        assert abs(a - b) <= 1e-6 * abs(b)
    # Stage 1 sends backward to stage 0: warm-up 0, so only micro-batch M-1 is critical.
    # Two replicas (dp=2), each counted; r(n+m) elements vs n*m.
    r, n, m = 2, S * B, H
    per_iter = 2 * ((M - 1) * n * m * 4 + 1 * r * (n + m) * 4)
    assert bwd_bytes == {"sent": 12 * per_iter, "raw": 12 * 2 * M * n * m * 4,
                         "messages": 12 * 2 * M}
    assert lossy[-1] < lossy[0]


def test_backward_codec_gets_every_cb_option():
    from megatron.cc.config import CompressionConfig
    from megatron.cc.pipeline.registry import LinkEnd, pp_codec

    def backward_codec(c, seed):   # as the driver builds a bwd link end's codec
        return pp_codec(c, "pp-bwd", LinkEnd("pp-bwd", comp_seed=seed))
    assert backward_codec(CompressionConfig(), seed=1) is None
    c = backward_codec(CompressionConfig(
        inter_grad_comp=True, inter_grad_comp_rank=7, use_error_feedback=True,
        lep_flush_on_uncompressed=True, inter_grad_comp_power_iters=3,
        inter_grad_comp_dtype="bfloat16"), seed=5)
    assert (c.rank, c.error_feedback, c.flush_on_uncompressed, c.power_iters, c.seed) == \
        (7, True, True, 3, 5)
    assert str(c.payload_dtype) == "torch.bfloat16"
