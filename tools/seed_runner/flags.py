"""The seeds' runner flags (AC-SGD's and TAH-Quant's dist_lm_runner.py, CocktailSGD's
dist_lm_train.py), parsed with their spellings and defaults. Flags not listed here go on to
pretrain_gpt.py unchanged when it knows them (e.g. --tile-size, --stochastic-rounding)."""
import argparse


def _bool(x: str) -> bool:
    if str(x).lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {x!r}")
    return str(x).lower() in ("true", "1")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="AC-SGD / TAH-Quant / CocktailSGD runner flags on megatron-cc's trainer",
        allow_abbrev=False)
    g = p.add_argument_group("distributed (one process per rank, or under torchrun)")
    g.add_argument("--dist-url", default=None, help="tcp://HOST:PORT of rank 0 (default: "
                   "MASTER_ADDR/MASTER_PORT from the environment, as torchrun sets them).")
    g.add_argument("--world-size", type=int, default=None, help="Processes in the job "
                   "(default: WORLD_SIZE).")
    g.add_argument("--rank", type=int, default=None, help="This process's rank (default: RANK).")
    g.add_argument("--pipeline-group-size", type=int, default=None,
                   help="Pipeline stages (default: --world-size / --data-group-size).")
    g.add_argument("--data-group-size", type=int, default=1, help="Data-parallel replicas.")
    g.add_argument("--cuda-id", type=int, default=None, help="GPU index of this process "
                   "(default: LOCAL_RANK).")
    g.add_argument("--use-cuda", type=_bool, default=None, help="true/false; default: true "
                   "when CUDA is present.")
    g.add_argument("--dist-backend", default=None, help="cupy_nccl|nccl|gloo: the process "
                   "group's backend (cupy_nccl means nccl here).")
    g.add_argument("--cuda-num", type=int, default=1, help="Seed flag; accepted, unused.")
    g.add_argument("--debug-mem", type=_bool, default=True, help="Seed flag; accepted, unused "
                   "(peak memory is always printed at the end).")
    g.add_argument("--job-id", default="0", help="CocktailSGD coordinator id; unused.")
    g.add_argument("--net-interface", default=None, help="Sets GLOO_SOCKET_IFNAME and "
                   "NCCL_SOCKET_IFNAME when they are unset.")

    g = p.add_argument_group("model")
    g.add_argument("--model-name", required=True, help="Local Hugging Face model directory, "
                   "or a megatron-cc checkpoint directory (nothing is downloaded).")
    g.add_argument("--tokenizer-name", default=None, help="Local tokenizer directory "
                   "(default: --model-name).")
    g.add_argument("--model-type", default=None, help="Model family (CocktailSGD: gpt2, opt, "
                   "gptneox, gptj, llama, qwen2); checked against config.json's model_type, "
                   "imported with tools/checkpoint/import_hf.py.")
    g.add_argument("--load-pretrained-model", type=_bool, default=True,
                   help="true: start from the model's weights; false: random weights of its "
                        "architecture.")
    g.add_argument("--num-layers", type=int, default=None, help="Layers PER STAGE (the seeds' "
                   "meaning): the model has this x --pipeline-group-size layers.")
    g.add_argument("--num-heads", type=int, default=None, help="Attention heads (checked).")
    g.add_argument("--embedding-dim", type=int, default=None, help="Hidden size (checked).")
    g.add_argument("--seq-length", type=int, default=1024, help="Sequence length.")

    g = p.add_argument_group("task and training")
    g.add_argument("--task-name", required=True, help="Local data: comma-separated items "
                   "FILE.jsonl[:WEIGHT] or PREFIX[:WEIGHT] (a .bin/.idx prefix).")
    g.add_argument("--task-type", default="language_model", help="language_model only.")
    g.add_argument("--split", default="95,5,0", help="Ours: train,valid,test split of the task "
                   "documents (the seeds read separate test files).")
    g.add_argument("--n-epochs", type=int, default=10, help="Epochs over the training split.")
    g.add_argument("--num-iters", type=int, default=None, help="Upper bound on iterations.")
    g.add_argument("--total-steps", type=int, default=None, help="CocktailSGD: iterations "
                   "(instead of --n-epochs).")
    g.add_argument("--warmup-epochs", type=float, default=None, help="Epochs sent uncompressed "
                   "(AC-SGD default 1, only with a compression method).")
    g.add_argument("--warmup-steps", type=int, default=None, help="Learning-rate warm-up "
                   "iterations (default: one epoch, as AC-SGD).")
    g.add_argument("--train-warmup-steps", type=int, default=0, help="CocktailSGD; only 0 has "
                   "a counterpart.")
    g.add_argument("--batch-size", type=int, default=32, help="Samples per iteration per "
                   "data-parallel replica (the seeds' macro-batch).")
    g.add_argument("--micro-batch-size", type=int, default=8, help="Samples per micro-batch.")
    g.add_argument("--gradient-accumulate-step", type=int, default=1, help="Macro-batches per "
                   "optimizer step (CocktailSGD).")
    g.add_argument("--lr", type=float, default=0.01, help="Peak learning rate.")
    g.add_argument("--optimizer", default="adam", help="adam (AdamW, as the seeds') or sgd: "
                   "pretrain_gpt.py --optimizer.")
    g.add_argument("--seed", type=int, default=1, help="Random seed.")
    g.add_argument("--do-evaluation", type=_bool, default=True, help="Validate every epoch.")
    g.add_argument("--checkpoint-path", default=None, help="CocktailSGD: save checkpoints here.")
    g.add_argument("--checkpoint-steps", type=int, default=None, help="Iterations between "
                   "checkpoints.")
    g.add_argument("--project-name", default=None, help="Weights & Biases project; unused.")
    g.add_argument("--fp16", action="store_true", help="float16 mixed precision (GPU).")
    for name in ("--loss-scale", "--initial-loss-scale", "--min-loss-scale",
                 "--loss-scale-window", "--hysteresis"):
        g.add_argument(name, type=float, default=None, help="fp16 loss scaling; passed on "
                       "when pretrain_gpt.py has the flag.")

    g = p.add_argument_group("schedules, compression, profiling")
    g.add_argument("--pp-mode", default="gpipe", choices=["gpipe", "1f1b"],
                   help="Pipeline schedule (the seeds' default gpipe).")
    g.add_argument("--dp-mode", default="allreduce", help="allreduce, or a mode of "
                   "pretrain_gpt.py --dp-mode (cocktail_sgd, with QUANT_BITS / TOPK_RATIO / "
                   "RANDOMP_RATIO from the environment, ...).")
    g.add_argument("--dp-backend", default=None, help="gloo|nccl (cupy_nccl means nccl): "
                   "transport of the data-parallel channel (pretrain_gpt.py --dp-backend).")
    g.add_argument("--forward-compress-method", default="none",
                   help="none|fixpoint|delta|delta-lowbits|tah (TAH-Quant's spelling tha too).")
    g.add_argument("--backward-compress-method", default="none", help="none|fixpoint|lowrank.")
    for name in ("--forward-scale-method", "--backward-scale-method"):
        g.add_argument(name, default="max", help="max only (one scale per hidden channel).")
    for name in ("--forward-scale-dims", "--backward-scale-dims"):
        g.add_argument(name, default="(0,1)", help="(0,1) only.")
    g.add_argument("--dp-bits", type=int, default=None, help="AC-SGD's sharded-PS dp "
                   "quantisation; no counterpart.")
    g.add_argument("--profiling", default="no-profiling",
                   choices=["no-profiling", "tidy_profiling", "pytorch_profiling"],
                   help="tidy_profiling / pytorch_profiling: a Chrome trace per rank under "
                        "./trace_json/ (torch.profiler).")
    g.add_argument("--trace-postfix", default="default", help="Suffix of the trace file name.")
    g.add_argument("--runner-cache-dir", default=".cache/dist_lm_runner", help="Ours: where "
                   "the imported model and tokenised task files are kept between runs.")
    g.add_argument("--print-command", action="store_true", help="Ours: print the pretrain_gpt.py "
                   "command this maps to and exit.")
    return p
