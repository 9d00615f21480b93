"""The command line: Megatron-LM's flag names grouped into dataclasses (arguments.py), the
seeds' flags mapped onto them (seed_flags.py), GPU options (device_args.py) and what
--compression auto sets (auto_flags.py)."""
