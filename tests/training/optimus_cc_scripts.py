"""The argument lists of the Optimus-CC seed's scripts, as data (AIS-SNU/Optimus-CC, ASPLOS23/
and examples/), with their shell placeholders left as {name} fields.

Eight of the 38 scripts were read flag by flag (tbl2 CB-FE-SC 2.5B, fig10 CB-FE 8.3B, fig11,
fig12 CB-LEP 2.5B, functionality_check CB / CB-FE-SC / example, lsf_run_pretrain_example); they
share the template below line for line, so the others are written as the template with the
scheme their file name states (CB = CB with LEP as in the scripts read; CB-NON-LEP and the
Fig. 12 "CB" without --use_error_feedback).

Every ASPLOS23 script is one template: the GPT-2 Megatron-LM v2.5 flags below, the model size
and parallel sizes of its experiment, its experiment name and the compression flags of its
scheme. The v2.5 examples (examples/pretrain_gpt*.sh) are written out whole.
"""

BASE = ("--num-layers {L} --hidden-size {H} --num-attention-heads {A} --micro-batch-size 8 "
        "--global-batch-size 512 --seq-length 1024 --max-position-embeddings 1024 "
        "--train-iters {iters} --lr-decay-iters 320000 --save {ckpt} --load {ckpt} "
        "--data-path {data} --vocab-file {vocab} --merge-file {merges} --data-impl mmap "
        "--split 949,50,1 --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine "
        "--min-lr 1.0e-5 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 "
        "--activations-checkpoint-method uniform --save-interval 100 --eval-interval 100 "
        "--eval-iters 10 --tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} "
        "--experiment_name {name} --DDP-impl local")

CB = "--inter_grad_comp --inter_grad_comp_rank 16 --inter_grad_comp_epilogue_only"
LEP = "--use_error_feedback"
FE = "--emb_comm_opt"
SC = ("--grad_comp --grad_comp_rank 128 --grad_comp_warm_up 0.0 --selective_grad_comp "
      "--selective_grad_comp_way 3")
SCHEMES = {
    "Baseline": "",
    "CB": f"{CB} {LEP}",
    "CB-FE": f"{CB} {FE} {LEP}",
    "CB-FE-SC": f"{SC} {CB} {FE} {LEP}",
    "CB-NON-LEP": CB,
}
SIZES = {"335M": dict(L=24, H=1024, A=16, tp=2, pp=2),
         "2.5B": dict(L=52, H=1920, A=24, tp=8, pp=4),
         "8.3B": dict(L=72, H=3072, A=24, tp=8, pp=4)}


def _script(size, scheme_flags, name, iters):
    return BASE.format(name=name, iters=iters, ckpt="{ckpt}", data="{data}", vocab="{vocab}",
                       merges="{merges}", **SIZES[size]) + " " + scheme_flags + " --log-interval 1"


def _asplos23():
    s = {}
    for size in SIZES:                                   # Table 2 / Fig. 9 / Table 4
        for scheme in ("Baseline", "CB", "CB-FE", "CB-FE-SC"):
            s[f"tbl2_fig9_tbl4/GPT2-{size}-{scheme}.sh"] = _script(
                size, SCHEMES[scheme], f"GPT2-{size}-{scheme}", 230000)
    s["tbl2_fig9_tbl4/GPT2-2.5B-CB-NON-LEP.sh"] = _script(
        "2.5B", SCHEMES["CB-NON-LEP"], "GPT2-2.5B-CB-NON-LEP", 230000)
    for size in SIZES:                                   # Fig. 10 speed breakdown
        for scheme in ("Baseline", "CB", "CB-FE", "CB-FE-SC"):
            s[f"fig10/GPT2-{size}-{scheme}-Breakdown.sh"] = _script(
                size, SCHEMES[scheme], f"GPT2-{size}-{scheme}-Breakdown", 10)
    s["fig11/GPT-8.3B-Orth_AVG_Check.sh"] = _script(     # Fig. 11 LEP diagnostic
        "8.3B", "--inter_grad_comp --inter_grad_comp_rank 16 --use_error_feedback "
                "--check_orth_error_acti", "GPT-8.3B-Orth_AVG_Check", 1000)
    for size in ("2.5B", "8.3B"):                        # Fig. 12 memory
        for scheme, flags in (("Baseline", ""), ("CB", CB), ("CB-LEP", f"{CB} {LEP}")):
            s[f"fig12/GPT-{size}-{scheme}-Memory.sh"] = _script(
                size, flags, f"GPT-{size}-{scheme}-Memory", 10)
    for scheme, name in (("Baseline", "A100-Baseline"), ("CB", "A100-CB"),     # small cluster
                         ("Baseline", "A100-example"), ("CB-FE", "CB-FE"),
                         ("CB-FE-SC", "CB-FE-SC")):
        s[f"functionality_check/GPT2-335M-{name}-Breakdown.sh"] = _script(
            "335M", SCHEMES[scheme], f"GPT2-335M-{name}-Breakdown", 10)
    s["lsf_run_pretrain_example.sh"] = (
        "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --micro-batch-size 8 "
        "--global-batch-size 1024 --seq-length 1024 --max-position-embeddings 1024 "
        "--train-iters 3000 --lr-decay-iters 320000 --save {ckpt} --load {ckpt} "
        "--data-path {data} --vocab-file {vocab} --merge-file {merges} --data-impl mmap "
        "--split 949,50,1 --distributed-backend nccl --lr 0.00015 --lr-decay-style cosine "
        "--min-lr 1.0e-5 --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 "
        "--activations-checkpoint-method uniform --log-interval 1 --save-interval 100 "
        "--eval-interval 100 --eval-iters 10 --no-masked-softmax-fusion "
        "--experiment_name {name} --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 1 --DDP-impl local")
    return s


# Megatron-LM v2.5's GPT examples, which the seed ships unchanged (the three 345M ones share
# everything after the batch sizes).
_V25_345M = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --micro-batch-size {mbs} "
             "--global-batch-size {gbs} --seq-length 1024 --max-position-embeddings 1024 "
             "--train-iters 500000 --lr-decay-iters 320000 --save {{ckpt}} --load {{ckpt}} "
             "--data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}} --data-impl mmap "
             "--split 949,50,1 --distributed-backend nccl --lr 0.00015 --min-lr 1.0e-5 "
             "--lr-decay-style cosine --weight-decay 1e-2 --clip-grad 1.0 "
             "--lr-warmup-fraction .01 --checkpoint-activations --log-interval 100 "
             "--save-interval 10000 --eval-interval 1000 --eval-iters 10 --fp16")
V25_EXAMPLES = {
    "examples/pretrain_gpt.sh": _V25_345M.format(mbs=4, gbs=8),
    "examples/pretrain_gpt_distributed.sh": _V25_345M.format(mbs=8, gbs=64),
    "examples/pretrain_gpt_distributed_with_mp.sh": (
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        + _V25_345M.format(mbs=2, gbs=16)),
    "examples/pretrain_gpt3_175B.sh": (
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --num-layers 96 "
        "--hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 1536 "
        "--rampup-batch-size 16 16 5859375 --train-samples 146484375 "
        "--lr-decay-samples 126953125 --lr-warmup-samples 183105 --lr 6.0e-5 --min-lr 6.0e-6 "
        "--lr-decay-style cosine --log-interval 10 --eval-iters 40 --eval-interval 1000 "
        "--data-path {data} --vocab-file {vocab} --merge-file {merges} --save-interval 1000 "
        "--save {ckpt} --load {ckpt} --split 98,2,0 --clip-grad 1.0 --weight-decay 0.1 "
        "--adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --tensorboard-dir {tb} "
        "--fp16 --checkpoint-activations"),
}

OPTIMUS_CC_SCRIPTS = _asplos23()
ALL_SCRIPTS = {**OPTIMUS_CC_SCRIPTS, **V25_EXAMPLES}


def fill(template: str, **values) -> list:
    """argv of a script with its placeholders filled (default name: the script's own)."""
    return template.format(**values).split()


def override(argv: list, **values) -> list:
    """Replace the value of each given flag in argv (in whichever spelling argv uses)."""
    out = list(argv)
    for key, value in values.items():
        dashed, underscored = "--" + key.replace("_", "-"), "--" + key
        i = out.index(dashed if dashed in out else underscored)
        out[i + 1] = str(value)
    return out
