"""Pretrain a GPT model with tensor x pipeline x data parallelism and compressed communication.

CPU demo (8 processes, TP2 x PP2 x DP2, the embedded corpus and tokenizer):
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 8 pretrain_gpt.py \
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
        --micro-batch-size 4 --global-batch-size 32 --train-iters 300 --lr 1e-3

GPU node (8 GPUs, your data):
    torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 4 \
        --pipeline-model-parallel-size 2 --num-layers 24 --hidden-size 1024 \
        --num-attention-heads 16 --seq-length 1024 --micro-batch-size 8 \
        --global-batch-size 256 --train-iters 10000 --lr 3e-4 --bf16 \
        --data-path my_text_document --vocab-file vocab.json --merge-file merges.txt

See examples/ for multi-node torchrun, Slurm and LSF (docs/running.md), and README.md for the
compression flags.
Optimus-CC's scripts (Megatron-LM v2.5 flags, `python -m torch.distributed.launch`) run as they
are; docs/seed_commands.md maps every seed command, and tools/dist_lm_runner.py takes AC-SGD's,
TAH-Quant's and CocktailSGD's runner command lines.
"""
import sys

from megatron.training.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
