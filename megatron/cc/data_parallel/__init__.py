"""The data-parallel channel: one plug-in per --dp-mode, each beside its implementation.

    registry.py       DP_MODES, dp_sections (the config dataclasses), DpRules, build_dp_channel
    base.py           DpMode (a plug-in: flags, checks, `build` of the channel), DpRun
    allreduce.py      --dp-mode allreduce: exact, or --grad-comp PowerSGD (powersgd.py,
                      randomized_svd.py, overlap.py)
    diloco.py         DiLoCo: H inner steps, outer step (diloco_sync.py; lowrank_exchange.py,
                      sync_schedule.py, pseudo_grad_capture.py)
    sparseloco.py     SparseLoCo: chunked top-k with error feedback (sparseloco_sync.py,
                      gather_exchange.py)
    cocktail_sgd.py   CocktailSGD: compressed parameter deltas (cocktail_sync.py,
                      sharded_exchange.py)
    preduce.py        SD-PIPE partial reduce (preduce_sync.py, preduce_sched.py)
    adpsgd.py         AD-PSGD pairwise gossip (preduce_sync.py)
    flat_codecs.py    flat-vector codecs of the parameter-syncing modes
    replica_adam.py   --dp-adam-correction: Adam's second moment of the all-reduced gradient
    hetero.py         --hetero: emulated slow replicas

Adding a dp mode: a file here and a line in registry.py's DP_MODES.
"""
