"""Checkpoints in Megatron-LM's layout, resumable bit for bit.

    save_load.py          saves and loads registered Statefuls (model, optimizer, progress, RNG,
                          every channel)
    checkpoint_io.py      atomic files with checksums, read without running their pickle
    checkpoint_select.py  which checkpoint --load resumes from
    checkpoint_match.py   refuse tensors that do not fit the model, by name
    checkpoint_args.py, checkpoint_compat.py   Megatron-LM's `args` and directory layout
    checkpoint_distopt.py the distributed optimizer's Adam state by parameter name
    async_save.py         background writes (--async-save)
    replica_state.py      the parameter-syncing dp modes' state
"""
