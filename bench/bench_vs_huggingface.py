"""Tokens/s of our driver at (1,1,1) against a plain PyTorch step of Hugging Face GPT-2.

Same architecture (GPT2LMHeadModel config mirrored from our flags), same batch (micro-batch
x micro-batches of the same token ids), AdamW + grad clipping on both sides, fp32, dropout 0,
one process with the same thread count. Both run in this process, alternating in rounds, so
machine noise hits them alike; the printed ratio is ours / Hugging Face (target >= 0.9).

    OMP_NUM_THREADS=1 python bench/bench_vs_huggingface.py [--iters 30 --rounds 3]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def our_trainer(flags):
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    from megatron.training.loop.training import Trainer
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29561"),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    args = parse_args(flags, world_size=1)
    from megatron.training.pretrain import resolve_default_data
    resolve_default_data(args)
    initialize_distributed(args)
    return Trainer(args)


def hf_model(trainer):
    from transformers import GPT2Config, GPT2LMHeadModel
    m = trainer.args.model
    config = GPT2Config(vocab_size=trainer.padded_vocab_size, n_positions=m.max_position_embeddings,
                        n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_attention_heads,
                        n_inner=m.ffn_hidden_size,
                        # our GeLU, as tools/checkpoint exports it: exact, or tanh (gelu_new)
                        activation_function="gelu_new" if m.openai_gelu else "gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=m.layernorm_epsilon, tie_word_embeddings=True,
                        bos_token_id=trainer.tokenizer.eod, eos_token_id=trainer.tokenizer.eod)
    config._attn_implementation = "eager"  # same attention math as megatron-core's local spec
    return GPT2LMHeadModel(config)


def hf_batches(trainer):
    from megatron.training.data import datasets as data_mod
    M = trainer.args.num_microbatches
    return [data_mod.collate(trainer.train_ds, trainer.batches.sample_ids(0, mb, 0))
            for mb in range(M)]


def time_ours(trainer, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        trainer.consumed_samples = 0  # same batch every step, like the HF side
        trainer.train_step()
    return time.perf_counter() - t0


def time_hf(model, opt, batches, iters, clip):
    t0 = time.perf_counter()
    M = len(batches)
    for _ in range(iters):
        opt.zero_grad(set_to_none=True)
        for b in batches:
            out = model(input_ids=b["tokens"], labels=None)
            logits = out.logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), b["labels"].view(-1))
            (loss / M).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=20, help="timed iterations per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (best kept)")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    flags = ["--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
             "--num-attention-heads", "8", "--seq-length", str(a.seq_length),
             "--micro-batch-size", str(a.micro_batch_size),
             "--global-batch-size", str(a.global_batch_size), "--train-iters", "100000",
             "--attention-dropout", "0", "--hidden-dropout", "0", "--lr", "1e-4",
             "--lr-decay-style", "constant", "--eval-interval", "0", "--log-interval", "1000000"]
    trainer = our_trainer(flags)
    model = hf_model(trainer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    batches = hf_batches(trainer)
    tokens = a.global_batch_size * a.seq_length * a.iters
    time_ours(trainer, 2)
    time_hf(model, opt, batches, 2, 1.0)  # warm-up both
    ours, hf = [], []
    for r in range(a.rounds):
        ours.append(tokens / time_ours(trainer, a.iters))
        hf.append(tokens / time_hf(model, opt, batches, a.iters, 1.0))
        print(f"round {r}: ours {ours[-1]:.0f} tok/s | HF GPT2LMHeadModel {hf[-1]:.0f} tok/s")
    best_ours, best_hf = max(ours), max(hf)
    print(f"\nmodel: {a.num_layers} layers, hidden {a.hidden_size}, seq {a.seq_length}, "
          f"batch {a.global_batch_size} ({trainer.args.num_microbatches} micro-batches), "
          f"vocab {trainer.padded_vocab_size}, threads {torch.get_num_threads()}")
    print(f"{'':24s}{'tokens/s':>12s}")
    print(f"{'pretrain_gpt (1,1,1)':24s}{best_ours:12.0f}")
    print(f"{'HF GPT2LMHeadModel':24s}{best_hf:12.0f}")
    print(f"ratio ours/HF: {best_ours / best_hf:.3f}")
    from megatron.training.runtime.initialize import destroy
    destroy()


if __name__ == "__main__":
    main()
