"""The fake-CUDA tier: the GPU path, checked on every CPU run (part of `make test`).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/fake_cuda -q

CI and development machines have no GPU; users train on GPUs. Here every GPU code path runs
on a CPU-only torch with `cuda` tensors of torch's FakeTensorMode (shapes, dtypes and devices,
no data): a CPU tensor meeting a GPU tensor raises as it would on a GPU, every host read of a
GPU value (.item(), bool(), .tolist(), .cpu(), boolean-mask indexing) is recorded and, inside
`gpu.strict()`, raises HostSync; torch.distributed runs emulated over a one-rank gloo group
with each backend's restrictions (gloo refuses CUDA tensors in send/recv/isend/irecv and in a
coalesced all-reduce; NCCL refuses CPU tensors, a tensor on another GPU and two ranks on one
GPU). How each piece is faked, and what cannot run (autograd's C++ engine: replaced by
python_backward; real collectives; Triton/torch.compile: eager), is in fake_gpu.py, the one
module holding every patch; test_harness.py checks the emulations themselves.

    test_training_step.py      the (1,1,1) step as pretrain_gpt.py builds it: model on the rank's
                               device, DDP buffers, optimizer, scheduler, forward + loss,
                               backward, grad sync, optimizer step, evaluation, checkpoint
                               save and resume onto the GPU; fp32/bf16/fp16 x GPT-2/Llama on
                               gloo, and bf16 GPT-2 on NCCL
    test_codecs.py             every registered activation codec: encode/decode/observe/
                               pass_through without host sync, state round trip onto the GPU
    test_pipeline_channels.py  the pp send path (codecs + transport) on gloo and NCCL
    test_dp_modes.py           every dp mode (allreduce, overlapped, PowerSGD, randomized SVD,
                               CocktailSGD, DiLoCo, preduce, AD-PSGD) and the emb channel
                               (plain, fused, PowerSGD): a 2-replica job's per-rank compute
    test_sparseloco.py         the SparseLoCo codec and all-gather exchange
    test_harness.py            the fake GPU's own checks and upgrade canaries

Runtime: 86 tests, ~40 s of CPU (about 46 s wall on a busy 2-core machine, of which ~7 s are
imports and the shared tiny corpus). Fake dispatch costs ~0.4 ms an op, so the cases are
chosen per code path (see each file), not every combination.
The fake CUDA device guard is compiled once with g++ (~1 s, cached in the temp dir); without
a C++ compiler the tier skips, saying so.

Defects this tier found (each test failed before its fix):
    GradSync -> megatron DDP finish_grad_sync -> _coalescing_manager -> gloo
        allreduce_coalesced: "unsupported device type cuda" at the first step on any GPU run
        over gloo (test_training_step, all 6 cases) -- megatron/cc/grad_sync/sync.py
    delta / delta-lowbits built without sample_shape, resumed: cache rebuilt on the CPU,
        "the activation cache serves cpu" at the first GPU message (test_codecs, delta cases)
        -- megatron/cc/codecs/delta.py
    adpsgd on gloo: batch_isend_irecv of CUDA weights, which gloo cannot send
        (test_dp_modes[gloo-adpsgd]) -- megatron/cc/data_parallel/preduce_sync.py
    CocktailSGD / DiLoCo resumed: global copy, momentum, residual, in-flight job and server
        errors left on the CPU (device mismatch; NCCL refusing a CPU all-reduce; DiLoCo's outer
        step silently on the CPU over gloo) (test_dp_modes cocktail*/diloco*) --
        megatron/cc/grad_sync/{cocktail,diloco,sharded_exchange,param_sync}.py

Mistakes injected on purpose to prove the tier catches them (then reverted):
    (a) model not moved to the device (model.py: `return model` instead of
        `model.to(topo.device)`) -> test_training_step::test_step_eval_checkpoint_resume
        [gpt2-fp32]: "AssertionError: not on cuda:0: ['embedding.word_embeddings.weight', ...]"
    (b) causal mask made on the CPU (attention.py SDPAttention: attn_mask=torch.ones(S, S,
        dtype=bool).tril() instead of is_causal=True) -> the same test:
        "FakeTensorDeviceMismatchError: Expected all tensors to be on the same device, but
        found at least two devices, cuda:0 and cpu!" at megatron/training/model/attention.py:44
    (c) `.item()` in a codec's encode (FixpointCodec.encode: `if x.abs().max().item() == 0`)
        -> test_codecs (every fixpoint case) and test_pipeline_channels[fixpoint-*]:
        "HostSync: host sync inside a strict block: read aten._local_scalar_dense.default
        (.item()/bool()/tolist() of a cuda tensor) at megatron/cc/numerics/quant.py:393 (encode)"
    (d) coalesced gloo all-reduce on CUDA (sync.allreduce_buckets wrapped in
        dist._coalescing_manager; or the GradSync fix reverted) -> test_training_step[gpt2-fp32]
        and test_dp_modes[gloo-allreduce]: "GlooRefuses: ProcessGroupGloo::allreduce_coalesced:
        unsupported device type cuda"
"""
