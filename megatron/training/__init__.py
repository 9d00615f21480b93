"""The training driver. Importing it first silences megatron-core's optional-dependency
warnings (fallback_warnings), before any of its modules imports megatron.core."""
from megatron.training.fallback_warnings import silence_fallback_warnings

silence_fallback_warnings()
