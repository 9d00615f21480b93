"""Process groups the dp modes create on demand, after megatron's initialize_model_parallel."""
import torch.distributed as dist


def clone_groups(group, backend=None):
    """A second group with the same ranks as `group` (this rank's copy), for every such group.

    A background exchange thread needs a group of its own: two threads issuing collectives on
    one group could interleave differently on different ranks. Collective over the default
    group (every rank creates every group, in the same order).
    """
    mine = tuple(dist.get_process_group_ranks(group))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out = None
    for ranks in sorted(set(everyone)):
        g = dist.new_group(list(ranks), backend=backend)
        if ranks == mine:
            out = g
    return out
