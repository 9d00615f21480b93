"""AC-SGD / TAH-Quant / CocktailSGD's runner command line, run by megatron-cc's trainer.

One process per rank, exactly as the seeds' READMEs launch it:

    ARGS="--model-name models/gpt2 --tokenizer-name models/gpt2 --load-pretrained-model true \\
      --task-name data/wiki.jsonl --n-epochs 10 --warmup-epochs 1 \\
      --num-layers 6 --num-heads 25 --embedding-dim 1600 \\
      --num-iters 10000000 --lr 5e-5 --seq-length 1024 --batch-size 32 --micro-batch-size 1 \\
      --forward-compress-method delta --forward-bits 4 \\
      --backward-compress-method fixpoint --backward-bits 8 \\
      --dist-url tcp://10.0.0.1:9000 --world-size 8 --pipeline-group-size 8 \\
      --pp-mode gpipe --profiling no-profiling --do-evaluation true"
    python tools/dist_lm_runner.py $ARGS --cuda-id 0 --rank i      # i = 0 .. 7, one per GPU

or under torchrun (`torchrun --nproc-per-node 8 tools/dist_lm_runner.py $ARGS`: rank, world
size and address then come from the environment). CPU: add --use-cuda false.

What the flags become (`--print-command` prints the pretrain_gpt.py command and exits):
  --model-name DIR          a local Hugging Face directory of a family import_hf.py knows
                            (gpt2, opt, gpt_neox, gptj, llama, qwen2; --model-type is checked
                            against its config.json), imported once by rank 0 with
                            tools/checkpoint/import_hf.py at pp stages (cached under
                            --runner-cache-dir), loaded with --finetune; or a megatron-cc
                            checkpoint directory. --load-pretrained-model false: its
                            architecture with random weights.
  --num-layers N            per stage, as in the seeds: the model has N x pp layers (checked
                            against the model, like --num-heads and --embedding-dim)
  --task-name SPEC          FILE.jsonl[:W],... or .bin/.idx PREFIX[:W],...: tokenised once by
                            rank 0 (tools/preprocess_data.py) -> --data-path (weights: a blend)
  --n-epochs, --num-iters   -> --train-iters (epochs of the training split, capped by
                            --num-iters); --total-steps sets it directly (CocktailSGD)
  --warmup-epochs           -> --warmup-epochs (uncompressed epochs; AC-SGD default 1)
  --warmup-steps            -> --lr-warmup-iters (default one epoch), linear decay to 0
  --batch-size B            per replica: --global-batch-size B x dp x --gradient-accumulate-step
  --pp-mode gpipe|1f1b      -> --pp-mode (GPipe: all forwards, then all backwards)
  --forward-compress-method tha -> tah (TAH-Quant's spelling)
  --do-evaluation true      validation every epoch on the --split's validation documents
  --profiling tidy_profiling  a Chrome trace per rank (torch.profiler) in ./trace_json/
  --dp-mode, --dp-backend   -> --dp-mode (cocktail_sgd ...), --dp-backend gloo|nccl; CocktailSGD's
                            QUANT_BITS / TOPK_RATIO / RANDOMP_RATIO environment ->
                            --cocktail-bits / --cocktail-topk-ratio / --cocktail-random-ratio
  --optimizer adam|sgd      -> --optimizer (AdamW or SGD)

Any other flag pretrain_gpt.py knows (--tile-size, --backward-tile-size, --stochastic-rounding,
--inter-grad-comp, ...) is passed on unchanged; anything else is refused by name.
"""
import os
import sys
import time
from typing import List, Tuple

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.seed_runner import prepare, translate  # noqa: E402
from tools.seed_runner.flags import build_parser  # noqa: E402
from tools.seed_runner.prepare import RunnerError  # noqa: E402


def set_environment(a) -> None:
    """--rank / --world-size / --dist-url / --cuda-id -> the variables torch.distributed reads."""
    env = os.environ
    a.rank = a.rank if a.rank is not None else int(env.get("RANK", "0"))
    a.world_size = a.world_size if a.world_size is not None else int(env.get("WORLD_SIZE", "1"))
    if not 0 <= a.rank < a.world_size:
        raise RunnerError(f"--rank {a.rank} is outside 0..--world-size-1 ({a.world_size - 1})")
    if a.dist_url is not None:
        if not a.dist_url.startswith("tcp://") or ":" not in a.dist_url[6:]:
            raise RunnerError(f"--dist-url {a.dist_url}: expected tcp://HOST:PORT")
        host, port = a.dist_url[6:].rsplit(":", 1)
        env["MASTER_ADDR"], env["MASTER_PORT"] = host, port
    elif a.world_size > 1 and "MASTER_ADDR" not in env:
        raise RunnerError("--dist-url tcp://HOST:PORT is needed (or launch under torchrun)")
    env["RANK"], env["WORLD_SIZE"] = str(a.rank), str(a.world_size)
    local = a.cuda_id if a.cuda_id is not None else int(env.get("LOCAL_RANK", "0"))
    env["LOCAL_RANK"] = str(local)
    if a.net_interface:
        env.setdefault("GLOO_SOCKET_IFNAME", a.net_interface)
        env.setdefault("NCCL_SOCKET_IFNAME", a.net_interface)


def backend_argv(a) -> List[str]:
    import torch
    use_cuda = a.use_cuda if a.use_cuda is not None else torch.cuda.is_available()
    if use_cuda and not torch.cuda.is_available():
        raise RunnerError("--use-cuda true, but CUDA is not available; use --use-cuda false")
    if not use_cuda:
        return ["--distributed-backend", "gloo"]
    backend = {"cupy_nccl": "nccl", None: "nccl"}.get(a.dist_backend, a.dist_backend)
    return ["--distributed-backend", backend]


def build_command(a, extra: List[str]) -> Tuple[List[str], List[str]]:
    """(pretrain_gpt.py argv, notes)."""
    notes: List[str] = []
    known = translate.trainer_flags()
    pp, dp = translate.topology(a)
    translate.misc_checks(a, notes)
    argv = ["--pipeline-model-parallel-size", str(pp)] + backend_argv(a)
    tok = prepare.tokenizer_flags(a.tokenizer_name or a.model_name)
    if prepare.check_model_source(a) == "checkpoint":
        ckpt, model_args = a.model_name, prepare.checkpoint_model_args(a.model_name)
    else:
        ckpt, model_args = prepare.import_model(a, pp, tok)
    argv += translate.model_argv(a, model_args, pp) + tok
    if a.load_pretrained_model:
        argv += ["--load", ckpt, "--finetune"]
    else:
        notes.append("--load-pretrained-model false: the model's architecture, random weights")
    data = prepare.task_prefixes(a, tok)
    argv += ["--data-path"] + data + translate.learning_argv(a, dp)
    argv += translate.schedule_argv(a, data, translate.global_batch(a, dp), notes)
    argv += translate.compression_argv(a, notes) + translate.dp_argv(a, notes)
    argv += translate.precision_argv(a, known, notes)
    unknown = [x for x in extra if x.startswith("--") and x.split("=")[0] not in known]
    if unknown:
        raise RunnerError(f"{unknown[0]}: neither a runner flag of the seeds nor a "
                          f"pretrain_gpt.py flag (python tools/dist_lm_runner.py --help lists "
                          f"the first, python pretrain_gpt.py --help the second)")
    return argv + extra, notes


def trace_file(a, pp: int, dp: int) -> str:
    """The seeds' trace name: ./trace_json/gpt3_<pp-mode>[_<dp-mode>]_b.._l.._m.._w.._p.._d.._<rank>_..json"""
    prefix = f"./trace_json/gpt3_{a.pp_mode}" + (f"_{a.dp_mode}" if dp > 1 else "")
    return (f"{prefix}_b{a.batch_size}_{a.micro_batch_size}_l{a.seq_length}_m{a.embedding_dim}"
            f"_w{a.world_size}_p{pp}_{a.gradient_accumulate_step}_d{dp}_{a.rank}"
            f"{'_fp16' if a.fp16 else ''}_{a.profiling}_{a.trace_postfix}.json")


def run(a, argv: List[str]) -> int:
    from megatron.training import pretrain as pretrain_gpt
    if a.profiling == "no-profiling":
        return pretrain_gpt.main(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    with profile(activities=activities, profile_memory=a.profiling == "pytorch_profiling") as prof:
        code = pretrain_gpt.main(argv)
    path = trace_file(a, *translate.topology(a))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    prof.export_chrome_trace(tmp)
    os.replace(tmp, path)
    print(f"[rank {a.rank}] wrote Chrome trace {path} (open in chrome://tracing or Perfetto)",
          flush=True)
    return code


def main(argv=None) -> int:
    a, extra = build_parser().parse_known_args(argv)
    if a.use_cuda is False:
        # before torch is first imported: CUDA stays invisible to the whole run (CPU / gloo)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        set_environment(a)
        ours, notes = build_command(a, extra)
    except (RunnerError, ValueError) as e:
        os.write(2, f"[rank {os.environ.get('RANK', a.rank or 0)}] error: {e}\n".encode())
        return 2
    if a.rank == 0:
        for note in notes:
            print(f"note: {note}", flush=True)
        print("pretrain_gpt.py " + " ".join(ours), flush=True)
    if a.print_command:
        return 0
    t0 = time.time()
    code = run(a, ours)
    if a.rank == 0:
        print(f"dist_lm_runner: finished in {time.time() - t0:.1f}s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
