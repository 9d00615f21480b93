"""A cost model of compressed 3D-parallel training: bytes per channel, step time, a planner.

Pure Python over the codecs' own size formulas: no process groups, no tensors on the wire.

    shapes.py         ModelShape (the GPT/Llama families the driver builds) and Layout (tp, pp,
                      dp, micro-batches): every parameter of every stage, per tensor-parallel rank
    channel_bytes.py  per channel (pp-fwd, pp-bwd, dp, emb) the bytes one iteration puts on the
                      wire, summed over ranks: exactly what the training log line prints
    dp_bytes.py       the dp channel of every --dp-mode / --grad-comp reducer
    links.py          Cluster: nodes, GPUs per node, bandwidth and latency per level, YAML loading
    step_time.py      1F1B step time = compute + bubble + exposed communication, sync or overlapped
    codec_speeds.py   measured codec throughputs (codec_speeds_h200.json: the GPU defaults)
    quality.py        this project's measured loss gaps per scheme (docs/, bench/results)
    planner.py        candidate layouts x compression schemes, ranked by predicted step time

Nothing here reads flags; tools/plan_compression.py maps pretrain_gpt.py's flags onto these.
"""
