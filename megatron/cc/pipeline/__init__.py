"""The pipeline channels (pp-fwd: activations forward, pp-bwd: their gradients back).

    registry.py       FWD / BWD: one plug-in per --forward- / --backward-compress-method;
                      pp_sections (the config dataclasses), PpRules, pp_link / pp_codec
    base.py           PpMethod (a plug-in: flags, checks, `build` of the link end), LinkEnd,
                      Warmup
    fixpoint.py, fixpoint_bwd.py, delta.py, delta_lowbits.py, tah.py, lowrank.py,
    subspace.py       the plug-ins; each builds its codec (megatron/cc/codecs/) itself
    p2p.py            the link ends: encode, send / receive, decode, bytes counted
    schedule.py       1F1B and interleaved schedules over those links (prefetch, overlap)
    policy.py         which messages are compressed (warm-up, validation passes exact)
    diagnostics.py    Optimus-CC Fig. 11's LEP diagnostics (--check-orth-error-acti)

Adding a pipeline codec: a file here and a line in registry.py's FWD or BWD.
"""
