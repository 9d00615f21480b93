"""Hand-written Triton kernels for the codecs' hot steps on CUDA (one module per kernel family).

    dispatch      when the kernels run (CUDA tensor + triton + MEGATRON_CC_FUSED != 0); no triton
    primitives    shared @triton.jit pieces (rounding, scale round-up, tree sums, bit packing,
                  Walsh-Hadamard butterflies)
    group_sums    the kernels' summation order, in torch (no triton): the twins they match
    fixpoint      scales, quantise + pack, unpack + dequantise, plain pack / unpack
    delta         AC-SGD delta step against a device-resident cache, read in place
    tah           TAH-Quant tile transform, packing and decode
    sparse        CocktailSGD's decompress: mask ranks and the dense output in one pass
    lowrank       Gram-Schmidt of the lowrank codec in one launch

The eager code in megatron/cc/codecs stays the reference and the CPU path; every kernel is
bit-identical to it, or, where a reduction's order defines the result, to group_sums' twins.
Only `dispatch` and `group_sums` may be imported without triton installed.
"""
