"""What the dp and emb channels share: the hooks the training step calls on a gradient-sync
channel and the plain (uncompressed) sums. Each compressed method lives in its channel's
package (megatron/cc/data_parallel/, megatron/cc/embedding/).

    channel.py     SyncChannel: the hooks GradSync calls, each a no-op by default
    sync.py        GradSync (one dp and one emb channel per rank), ExactDataParallelSync
                   (megatron DDP's all-reduce), EmbeddingSync (the tied embedding's sum)
    param_sync.py  segments (tied embedding apart), flatten / copy helpers of parameter syncs
    groups.py      clone_groups: a dedicated group for a background exchange thread
"""
