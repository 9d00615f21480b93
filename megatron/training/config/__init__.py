"""The flag machinery every part of the driver uses: config dataclasses turned into flags,
ConfigError (config_flags.py). Imports nothing else of the driver."""
