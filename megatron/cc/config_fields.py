"""What the config dataclasses are built from: fields carrying their flag's help text, and
the error a bad value raises. The driver turns the fields into flags
(megatron.training.config_flags); the library only declares them.
"""
import dataclasses


class ConfigError(ValueError):
    """A flag value or combination that cannot work; the message names the flag and the fix."""


def flag(default, help: str, *, aliases=(), choices=None, type=None, spellings=None):
    """A dataclass field carrying its command-line help. `spellings`: {flag: (parse, help)}
    for a field several flags set, each its own way (the field's value has `then(later)`)."""
    meta = {"help": help, "aliases": tuple(aliases), "choices": choices, "type": type,
            "spellings": spellings}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=default: list(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
