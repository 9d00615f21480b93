"""LookedUpRows (megatron/cc/embedding/replica_embedding.py): the rows an untied word table's
iteration looked up, as this vocabulary shard's local indices; evaluation forwards are not
counted; taking them forgets them. On the CPU, and on the GPU where there is one (uint8
scatter-reduce on the device)."""
import pytest
import torch

from megatron.cc.embedding.replica_embedding import LookedUpRows
from megatron.cc.common.stats import ChannelStats

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Shard(torch.nn.Embedding):
    """A vocabulary shard [start, end) that, like megatron-core's, takes global ids."""

    def __init__(self, start, end, device):
        super().__init__(end - start, 4, device=device)
        self.vocab_start_index, self.vocab_end_index = start, end

    def forward(self, ids):
        inside = (ids >= self.vocab_start_index) & (ids < self.vocab_end_index)
        local = torch.where(inside, ids - self.vocab_start_index, 0)
        return super().forward(local) * inside.unsqueeze(-1)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_this_shard_from_training_forwards_only(device):
    shard = Shard(10, 20, device)
    rows = LookedUpRows(shard)
    shard(torch.tensor([[3, 12, 12], [19, 25, 10]], device=device))   # 12, 19, 10 are ours
    shard(torch.tensor([[15, 0]], device=device))
    with torch.no_grad():
        shard(torch.tensor([[11, 13]], device=device))                  # evaluation: not counted
    stats = ChannelStats()
    got = rows.take(stats)
    assert got.device.type == device
    assert got.tolist() == [0, 2, 5, 9]                                   # 10, 12, 15, 19 local
    shard(torch.tensor([[14]], device=device))
    assert rows.take(stats).tolist() == [4]                               # the last take forgot
