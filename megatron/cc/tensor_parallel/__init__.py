"""The tensor-parallel channel: Optimus-CC's PowerSGD on the row- and column-parallel layers'
all-reduces (--mp-acti-comp, --mp-grad-comp).

    powersgd.py   the plug-in: its flags (TpPowerSGD) and their checks
    tp_reduce.py  the compressed all-reduce and the wiring into megatron-core's layers
"""
