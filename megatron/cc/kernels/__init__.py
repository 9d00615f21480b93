"""Hand-written Triton kernels for the codecs' hot steps on CUDA (one module per kernel family).

    dispatch      when the kernels run (CUDA tensor + triton + MEGATRON_CC_FUSED != 0); no triton
    primitives    shared @triton.jit pieces: round half to even, 16-bit scale round-up, bf16 bits,
                  pairwise tree sums, 8-code bit packing, the Walsh-Hadamard butterflies
    group_sums    the kernels' summation order, in torch (no triton): the twins they match
    fixpoint      scale reduction / fitted search, quantise + pack, unpack + dequantise, plain
                  pack / unpack (codecs/fused.py dispatches to them)
    delta         AC-SGD delta step: quantise + pack + cache update, unpack + dequantise + add
    tah           TAH-Quant tile transform (outlier pivot, Hadamard, asymmetric quantisation),
                  code-stream packing, fused decode
    lowrank       Gram-Schmidt of the lowrank codec in one launch

The eager torch code in megatron/cc/codecs stays the reference and the CPU path. Every kernel
is bit-identical to it (payload bytes and decodes), checked on the CPU under Triton's interpreter
(tests/cc/kernels), except where a reduction's order defines the result (fitted scales, 1-bit
mean / RMS scales, Gram-Schmidt norms and projections): torch's own order differs between
devices, so `group_sums` fixes one and the kernels match its torch twins bit for bit.

Only `dispatch` and `group_sums` may be imported without triton installed.
"""
