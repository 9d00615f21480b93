"""Silence megatron-core's import-time warnings about Transformer Engine and Apex being absent.

The torch fallbacks they announce are what this project runs on CPU and what its local spec
uses on GPUs. Only those exact messages, raised from megatron.core modules, are filtered;
`fallback_note()` is the one line a GPU training run prints instead. The filter must be
installed before megatron.core is first imported, which megatron/training/__init__.py does.
"""
import importlib.util
import warnings
from typing import Optional

_MESSAGES = (r"Transformer Engine and Apex are not installed\.",
             r"Apex is not installed\. Falling back to Torch Norm")


def silence_fallback_warnings() -> None:
    for message in _MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=UserWarning,
                                module=r"megatron\.core(\.|$)")


def fallback_note() -> Optional[str]:
    """One line naming what is missing, or None when Transformer Engine or Apex is there."""
    missing = [name for name, module in (("Transformer Engine", "transformer_engine"),
                                         ("Apex", "apex"))
               if importlib.util.find_spec(module) is None]
    if len(missing) < 2:
        return None
    return ("Transformer Engine and Apex are not installed: megatron-core uses its torch "
            "optimizers, norms and multi-tensor fallbacks")
