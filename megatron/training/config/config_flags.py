"""Command-line flags generated from config dataclasses.

Each config dataclass owns its fields, their help text (field metadata) and its validation;
this module only turns fields into argparse flags and back. A field `foo_bar` becomes
`--foo-bar` (Megatron spelling) with `--foo_bar` accepted as an alias, so scripts written for
Optimus-CC's underscore flags run unchanged. Extra spellings go in metadata["aliases"].
"""
import argparse
import difflib
import os
import time
import typing

from megatron.cc.common.config_fields import (ConfigError, field_default, flag,  # noqa: F401
                                             flag_fields)   # (ConfigError, flag: re-exported)


class FlagParser(argparse.ArgumentParser):
    """argparse whose errors are the error line and a hint (the closest flag or choice), not
    the usage of every flag first, which buries the one useful line. Exit status 2, as
    argparse's."""

    def error(self, message: str, hint: str = ""):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0":
            # every rank parses the same flags: rank 0 alone speaks; the others linger so that
            # a launcher stopping the job on the first exit cannot cut rank 0's line
            time.sleep(3)
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {message}\n{hint}see {self.prog} --help\n")

    def parse_args(self, args=None, namespace=None):
        ns, unknown = self.parse_known_args(args, namespace)
        if unknown:
            flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")]
            near = [(f, self.closest(f, self._option_string_actions)) for f in flags]
            hints = [f"{m}" + (f" (for {f})" if len(flags) > 1 else "") for f, m in near if m]
            self.error(f"unrecognized arguments: {' '.join(unknown)}",
                       f"did you mean {', '.join(hints)}? " if hints else "")
        return ns

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            near = self.closest(str(value), [str(c) for c in action.choices or ()])
            if near is None:
                raise
            raise argparse.ArgumentError(action, f"{e.message}; did you mean {near!r}?") \
                from None

    @staticmethod
    def closest(word: str, candidates):
        found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
        return found[0] if found else None


def _base_type(annotation):
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        return _base_type(args[0])
    return annotation


class _Spelling(argparse.Action):
    """One of the flags of a field with several spellings: the value says how they combine."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, getattr(namespace, self.dest).then(value))


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, title: str) -> None:
    group = parser.add_argument_group(title)
    for owner, f in flag_fields(cls):
        if not f.metadata.get("help"):
            continue  # derived field, not a flag
        dashed = "--" + f.name.replace("_", "-")
        names = [dashed]
        if "_" in f.name:
            names.append("--" + f.name)
        names += [a for a in f.metadata.get("aliases", ()) if a not in names]
        default = field_default(f)
        for name, (parse, help_) in (f.metadata.get("spellings") or {}).items():
            spelled = dict.fromkeys([name, "--" + name[2:].replace("-", "_")])
            group.add_argument(*spelled, dest=f.name, default=default, type=parse, help=help_,
                               action=_Spelling, metavar=name[2:].upper().replace("-", "_"))
        if f.metadata.get("spellings"):
            continue
        kwargs = dict(dest=f.name, default=default, help=f.metadata["help"])
        hint = typing.get_type_hints(owner)[f.name]
        base = _base_type(hint)
        if base is bool and default:   # on by default: --foo keeps it, --no-foo turns it off
            kwargs["action"] = argparse.BooleanOptionalAction
        elif base is bool:
            kwargs["action"] = "store_true"
        elif typing.get_origin(base) is list:
            item = typing.get_args(base)[0]
            kwargs.update(nargs="+", type=f.metadata.get("type") or item)
        else:
            kwargs["type"] = f.metadata.get("type") or base
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        group.add_argument(*names, **kwargs)


def from_namespace(cls, ns: argparse.Namespace):
    """Build `cls` from the parsed flags it owns (derived fields keep their defaults)."""
    values = {f.name: getattr(ns, f.name) for _, f in flag_fields(cls)
              if f.metadata.get("help") and hasattr(ns, f.name)}
    return cls(**values)
