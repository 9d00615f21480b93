"""The emb channel: the tied embedding gradient's sum between the first and last stage.

    registry.py           EMB (plug-ins applied in order), EmbRules, build_emb_channel
    fused.py              Optimus-CC FE (--emb-comm-opt), implemented in fused_sync.py
    powersgd.py           --emb-grad-comp, implemented in powersgd_sync.py
    replica_embedding.py  an untied table's sum over the rows the iteration looked up
"""
