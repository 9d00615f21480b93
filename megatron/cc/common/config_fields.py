"""What the config dataclasses are built from: fields carrying their flag's help text, and
the error a bad value raises. The driver turns the fields into flags
(megatron.training.config.config_flags); the library only declares them.
"""
import dataclasses


class ConfigError(ValueError):
    """A flag value or combination that cannot work; the message names the flag and the fix."""


def flag(default, help: str, *, aliases=(), choices=None, type=None, spellings=None,
         low=None, high=None):
    """A dataclass field carrying its command-line help. `spellings`: {flag: (parse, help)}
    for a field several flags set, each its own way (the field's value has `then(later)`);
    `low` / `high`: the bounds of a given value (check_bounds)."""
    meta = {"help": help, "aliases": tuple(aliases), "choices": choices, "type": type,
            "spellings": spellings, "bounds": (low, high)}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=default: list(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_default(f: dataclasses.Field):
    """A field's default value (its factory called for a mutable one)."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def flag_fields(cls) -> list:
    """(owner class, field) of every flag of the config class `cls`: its dataclass fields, or,
    for a config composed of sections (`section_types()`), each section's in turn."""
    types = cls.section_types() if hasattr(cls, "section_types") else (cls,)
    return [(t, f) for t in types for f in dataclasses.fields(t)]


def channel_sections(shared, plugins) -> tuple:
    """A channel's config dataclasses: `shared` (the flags of every method), then each plug-in's
    `sections` (flags it shares with others) and the plug-in itself if it has fields, in order,
    each once."""
    out = [shared]
    for m in plugins:
        out += [*m.sections, *([m] if dataclasses.is_dataclass(m) and dataclasses.fields(m)
                               else [])]
    return tuple(dict.fromkeys(out))


def check_bounds(config) -> None:
    """ConfigError naming the flag of the first field outside its `low` / `high` bounds."""
    for _, f in flag_fields(type(config)):
        low, high = f.metadata.get("bounds", (None, None))
        value = getattr(config, f.name)
        if value is None or (low is None or value >= low) and (high is None or value <= high):
            continue
        want = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(f"--{f.name.replace('_', '-')} must be {want}, got {value}")
