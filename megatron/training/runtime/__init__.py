"""The run's environment: process groups, devices, nodes and the megatron-core bridge.

    initialize.py         process groups, seeds and the CPU shim, before the model exists
    topology.py           where this rank sits (stage, groups, device), built once
    transports.py         process groups per channel (--pp-backend, --dp-backend)
    nodes.py, link_probe.py   which node each rank is on; start-up link and compute probes
    rendezvous.py, signals.py, collective_errors.py   restarts, pre-emption, failure reports
    compat.py, cpu_shim.py, fallback_warnings.py      megatron-core 0.16 / 0.19, CPU, imports
"""
