"""The training driver. Importing it first silences megatron-core's optional-dependency
warnings (fallback_warnings) and the notices compat bridges, before any of its modules imports
megatron.core."""
from megatron.training.runtime.compat import quiet_upstream_notices
from megatron.training.runtime.fallback_warnings import silence_fallback_warnings

silence_fallback_warnings()
quiet_upstream_notices()
