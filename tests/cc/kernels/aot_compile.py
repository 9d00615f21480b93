"""Compile every kernel (the codecs' and the training loss') for an H100 (sm_90) ahead of time, no
GPU needed (Triton's bundled ptxas), and report per kernel whether its PTX has instructions that
would break bit-identity with the eager reference: fused multiply-adds (fma.rn.f32), approximate
division or square root. Run as `python -m tests.cc.kernels.aot_compile` (with TRITON_INTERPRET
unset); prints one JSON object. The interpreter (tests/cc/kernels/test_*.py) cannot show either.
"""
import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from megatron.cc.kernels import chunk_topk, delta, fixpoint, group_sums, lowrank, sparse, tah
from megatron.training.loop import cross_entropy_kernels as ce

TARGET = GPUTarget("cuda", 90, 32)
F, I = "fp32", "i32"


def group(mode, **k):
    ptrs = dict(x_ptr="*bf16", out_ptr="*fp32" if k.get("RAW") else "*i16", ratio_ptr="*fp32")
    sig = dict(ptrs, n_rise=I, n_tread=I, refits=I, NG=I, G=I, ROWLEN=I, NT=I, ESTRIDE=I,
               C0=F, LPS=F, C0T=F, LPST=F, QMAX=F)
    const = dict(MODE=mode, RAW=False, BF16=False, GB=32, L=64, LOGL=6)
    const.update(k)
    return fixpoint._group_scale_kernel, sig, const


def col_pass(stage, nk, **k):
    sig = dict(x_ptr="*bf16", part_ptr="*fp32", st_ptr="*fp32", c0_ptr="*fp32", N=I, C=I,
               NB=I, QMAX=F)
    ncp = 1 << max(0, (nk - 1).bit_length())
    const = dict(STAGE=stage, NK=nk, CB=fixpoint.COL_CB,
                 L=group_sums.COL_LANES, LOGL=group_sums.COL_LANES.bit_length() - 1,
                 CHUNKS=group_sums.COL_BLOCK_ROWS // group_sums.COL_LANES, NCP=ncp)
    const.update(k)
    return fixpoint._col_pass_kernel, sig, const


def col_reduce(stage, last, **k):
    sig = dict(part_ptr="*fp32", sb_ptr="*i32", sv_ptr="*fp32", st_ptr="*fp32",
               c0_ptr="*fp32", out_ptr="*i16", ratio_ptr="*fp32", N=I, C=I, NB=I, C0=F, LPS=F,
               C0T=F, LPST=F)
    const = dict(STAGE=stage, LAST=last, NRISE=13, NCAND=15, BF16=False,
                 CB=fixpoint.COL_REDUCE_CB, NBP=32, LOGNB=5, RAW=False)
    const.update(k)
    return fixpoint._col_reduce_kernel, sig, const


def quant_pack(**k):
    sig = dict(x_ptr="*fp16", s_ptr="*i16", out_ptr="*u8", prev_ptr="*fp32", new_ptr="*fp32",
               slot_ptr="*i64", N=I, NBYTES=I, C=I, G=I, NT=I, D1=I, D2=I, PS0=I, PS1=I,
               PS2=I, NS0=I, NS1=I, NS2=I, C0=F, LPS=F, C0T=F, LPST=F, QMAX=F)
    const = dict(GRAN=3, BITS=3, BF16=True, SIGNED=True, PREV=True, SLOTS=False, BLOCK=256,
                 BP=4)
    const.update(k)
    return fixpoint._quant_pack_kernel, sig, const


def unpack(**k):
    sig = dict(p_ptr="*u8", s_ptr="*i16", out_ptr="*i16", prev_ptr="*fp32", new_ptr="*fp32",
               slot_ptr="*i64", N=I, NBYTES=I, C=I, G=I, NT=I, D1=I, D2=I, PS0=I, PS1=I,
               PS2=I, NS0=I, NS1=I, NS2=I, C0=F, LPS=F, C0T=F, LPST=F)
    const = dict(GRAN=2, BITS=5, BF16=False, SIGNED=True, OUT=2, PREV=True, SLOTS=False,
                 BLOCK=256, BP=8)
    const.update(k)
    return fixpoint._unpack_dequant_kernel, sig, const


def tah_tiles(t):
    sig = dict(x_ptr="*bf16", high_ptr="*u8", codes_ptr="*u8", sz_ptr="*i16", flag_ptr="*u8",
               piv_ptr="*u8", NTILES=I, NT=I, C=I, FACTOR=F, INV_SQRT=F, HIGH_LEVELS=F,
               LOW_LEVELS=F, FLAG_BYTES=I, PIV_BYTES=I)
    pb = t.bit_length() - 1
    return tah._tiles_kernel, sig, dict(T=t, LOGT=pb, PB=pb, PBP=1 << (pb - 1).bit_length(),
                                        TB=max(8, 2048 // t))


def tah_pack_rows():
    sig = dict(codes_ptr="*u8", order_ptr="*i64", out_ptr="*u8", START=I, N=I, CP=I, NBYTES=I)
    return tah._pack_rows_kernel, sig, dict(BITS=3, BP=4, BLOCK=256)


def tah_decode(t, out):
    sig = dict(p_ptr="*u8", sz_ptr="*i16", high_ptr="*u8", rank_ptr="*i32",
               out_ptr="*i16" if out == 2 else "*fp32", NTILES=I, NT=I, C=I, CP=I,
               INV_SQRT=F, FLAG_OFF=I, PIV_OFF=I, HIGH_OFF=I, LOW_OFF=I, HIGH_BITS=I,
               LOW_BITS=I, NBYTES=I)
    pb = t.bit_length() - 1
    return tah._decode_kernel, sig, dict(T=t, LOGT=pb, PB=pb, TB=max(8, 2048 // t), OUT=out)


SPECS = {
    "lowrank.finish[bf16,1]": (lowrank._finish_kernel,
                               dict(p_ptr="*fp32", q_ptr="*fp32", qold_ptr="*fp32",
                                    sq_ptr="*fp32", ppd_ptr="*i16", ps_ptr="*fp32",
                                    qpd_ptr="*i16", qs_ptr="*fp32", N=I, M=I, R=I, NQB=I),
                               dict(PHASE=1, OUT=2, RP=16, BR=lowrank.FINISH_ROWS, NQBP=32)),
    "lowrank.finish[fp16,0]": (lowrank._finish_kernel,
                               dict(p_ptr="*fp32", q_ptr="*fp32", qold_ptr="*fp32",
                                    sq_ptr="*fp32", ppd_ptr="*fp16", ps_ptr="*fp32",
                                    qpd_ptr="*fp16", qs_ptr="*fp32", N=I, M=I, R=I, NQB=I),
                               dict(PHASE=0, OUT=1, RP=16, BR=lowrank.FINISH_ROWS, NQBP=32)),
    "lowrank.gram_schmidt[r16]": (lowrank._gram_schmidt_kernel,
                                  dict(p_ptr="*fp32", N=I, R=I, EPS=F, passes=I),
                                  dict(BR=512, LOGBR=9, RP=16)),
    "lowrank.expand[bf16]": (lowrank._expand_kernel,
                             dict(p_ptr="*bf16", q_ptr="*bf16", m_ptr="*i16", out_ptr="*i16",
                                  N=I, M=I, R=I),
                             dict(BN=lowrank.EXPAND_ROWS, BM=lowrank.EXPAND_COLS, OUT=2,
                                  SUB=False)),
    "lowrank.residual[bf16]": (lowrank._expand_kernel,
                               dict(p_ptr="*bf16", q_ptr="*bf16", m_ptr="*fp32",
                                    out_ptr="*fp32", N=I, M=I, R=I),
                               dict(BN=lowrank.EXPAND_ROWS, BM=lowrank.EXPAND_COLS, OUT=0,
                                    SUB=True)),
    "tah.entropy[bf16]": (tah._entropy_kernel, dict(x_ptr="*bf16", out_ptr="*fp32", C=I,
                                                    TINY=F), dict(BLOCK=1024)),
    "tah.split": (tah._split_kernel, dict(rank_ptr="*i64", high_ptr="*u8", bits_ptr="*u8",
                                          order_ptr="*i64", T=I, K=I, NBYTES=I),
                  dict(CH=tah.SPLIT_CHUNK)),
    "tah.tiles[t64]": tah_tiles(64),
    "tah.tiles[t2]": tah_tiles(2),
    "tah.pack_rows[3b]": tah_pack_rows(),
    "tah.decode[t16,bf16]": tah_decode(16, 2),
    "tah.ranks": (tah._ranks_kernel, dict(p_ptr="*u8", high_ptr="*u8", rank_ptr="*i32",
                                          NTOK=I), dict(CH=tah.RANK_CHUNK)),
    "fixpoint.group_scale[absmax,raw]": group(0, RAW=True, L=512, GB=4, LOGL=9),
    "fixpoint.group_scale[fitted,tile,bf16]": group(3, BF16=True),
    "fixpoint.group_scale[mean|x|]": group(1, L=8, GB=256, LOGL=3),
    "fixpoint.group_scale[rms]": group(2),
    "fixpoint.col_pass[max]": col_pass(0, 1),
    "fixpoint.col_pass[ladder]": col_pass(1, 15),
    "fixpoint.col_pass[fit]": col_pass(2, 4),
    "fixpoint.col_pass[refit]": col_pass(3, 6),
    "fixpoint.col_pass[rms]": col_pass(5, 1),
    "fixpoint.col_reduce[max,absmax]": col_reduce(0, True),
    "fixpoint.col_reduce[max]": col_reduce(0, False),
    "fixpoint.col_reduce[ladder]": col_reduce(1, False),
    "fixpoint.col_reduce[fit]": col_reduce(2, False, BF16=True),
    "fixpoint.col_reduce[refit,last]": col_reduce(3, True),
    "fixpoint.col_reduce[mean|x|,raw]": col_reduce(4, True, RAW=True),
    "fixpoint.quantize_pack[tile,3b,delta]": quant_pack(),
    "fixpoint.quantize_pack[channel,8b]": quant_pack(GRAN=1, BITS=8, BF16=False, SIGNED=False,
                                                     PREV=False, BP=8),
    "fixpoint.quantize_pack[channel,4b,delta in cache]": quant_pack(GRAN=1, BITS=4,
                                                                   SLOTS=True),
    "fixpoint.unpack_dequantize[bucket,5b,bf16,delta]": unpack(),
    "fixpoint.unpack_dequantize[channel,4b,bf16,delta in cache]": unpack(
        GRAN=1, BITS=4, SLOTS=True, BP=4),
    "delta.sub_cached[bf16]": (delta._sub_cached_kernel,
                               dict(x_ptr="*bf16", c_ptr="*fp32", slot_ptr="*i64",
                                    d_ptr="*fp32", N=I, D1=I, D2=I, CS0=I, CS1=I, CS2=I),
                               dict(BLOCK=delta.SUB_BLOCK)),
    "fixpoint.unpack_dequantize[tile,1b,fp16]": unpack(GRAN=3, BITS=1, SIGNED=False, OUT=1,
                                                       PREV=False, BP=1),
    "sparse.sample[bf16]": (sparse._sample_kernel,
                            dict(x_ptr="*bf16", vals_ptr="*fp32", mag_ptr="*fp32", NUMEL=I,
                                 N_RAND=I, OFFSET=I, STRIDE=I),
                            dict(MAG=True, BLOCK=sparse.SAMPLE_BLOCK)),
    "sparse.keep": (sparse._keep_kernel,
                    dict(vals_ptr="*fp32", keep_ptr="*i64", kept_ptr="*fp32", words_ptr="*i32",
                         K=I), dict(BLOCK=sparse.SAMPLE_BLOCK)),
    "chunk_topk.magnitude[bf16]": (chunk_topk._magnitude_kernel,
                                   dict(x_ptr="*bf16", mag_ptr="*fp32", NUMEL=I, TOTAL=I),
                                   dict(BLOCK=chunk_topk.BLOCK)),
    "chunk_topk.gather_pack[12b]": (chunk_topk._gather_pack_kernel,
                                    dict(x_ptr="*bf16", keep_ptr="*i64", vals_ptr="*fp32",
                                         idx_ptr="*u8", NUMEL=I, NKEEP=I, K=I, C=I,
                                         IDX_BYTES=I), dict(IBITS=12, BLOCK=chunk_topk.BLOCK)),
    "chunk_topk.scatter[2b,bf16]": (chunk_topk._scatter_kernel,
                                    dict(idx_ptr="*u8", codes_ptr="*u8", s_ptr="*i16",
                                         out_ptr="*i16", NUMEL=I, NKEEP=I, K=I, C=I,
                                         IDX_BYTES=I, CODE_BYTES=I, C0=F, LPS=F, C0T=F,
                                         LPST=F),
                                    dict(DENSE=False, IBITS=12, IB=4, BITS=2, BP=2, BF16=False,
                                         SIGNED=True, OUT=2, BLOCK=chunk_topk.BLOCK)),
    "sparse.mask_counts": (sparse._mask_counts_kernel,
                           dict(mask_ptr="*u8", counts_ptr="*i32", NBYTES=I),
                           dict(BB=sparse.BLOCK // 8)),
    "sparse.block_bases": (sparse._block_bases_kernel,
                           dict(counts_ptr="*i32", base_ptr="*i32", NBLK=I),
                           dict(CH=sparse.SCAN_CHUNK)),
    "sparse.scatter[4b,bf16]": (sparse._scatter_kernel,
                                dict(mask_ptr="*u8", base_ptr="*i32", codes_ptr="*u8",
                                     s_ptr="*i16", out_ptr="*i16", NUMEL=I, N_RAND=I, K=I,
                                     OFFSET=I, STRIDE=I, CODE_BYTES=I, BUCKET=I, C0=F, LPS=F,
                                     C0T=F, LPST=F),
                                dict(MASK=True, BITS=4, BP=2, BF16=False, SIGNED=True, OUT=2,
                                     BLOCK=sparse.BLOCK, SP=16)),
    "loss.forward[bf16]": (ce._forward_kernel, dict(x_ptr="*bf16", labels_ptr="*i64",
                                                    loss_ptr="*fp32", max_ptr="*fp32",
                                                    logsum_ptr="*fp32", stride=I, V=I, REAL=I),
                           dict(BLOCK=ce.BLOCK)),
    "loss.backward[bf16]": (ce._backward_kernel, dict(x_ptr="*bf16", labels_ptr="*i64",
                                                      max_ptr="*fp32", logsum_ptr="*fp32",
                                                      g_ptr="*fp32", dx_ptr="*bf16", stride=I,
                                                      dstride=I, V=I, REAL=I),
                            dict(BLOCK=ce.BLOCK)),
    "fixpoint.pack[7b]": (fixpoint._pack_kernel, dict(c_ptr="*u8", out_ptr="*u8", N=I, NBYTES=I),
                          dict(BITS=7, BP=8, BLOCK=256)),
    "fixpoint.unpack[1b]": (fixpoint._unpack_kernel, dict(p_ptr="*u8", out_ptr="*u8", N=I,
                                                          NBYTES=I), dict(BITS=1, BP=1, BLOCK=256)),
}

INEXACT = {"fma": r"\bfma\.rn\.f32", "approx_div": r"\bdiv\.(full|approx)\.f32",
           "approx_sqrt": r"\bsqrt\.approx\.f32"}


def main(names=None):
    report = {}
    for name, (fn, sig, const) in SPECS.items():
        if names and name not in names:
            continue
        sig = dict(sig, **{k: "constexpr" for k in const})
        src = ASTSource(fn=fn, signature=sig, constexprs=const)
        ptx = triton.compile(src, target=TARGET, options={"enable_fp_fusion": False}).asm["ptx"]
        report[name] = {k: bool(re.search(p, ptx)) for k, p in INEXACT.items()}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
