"""GPT2LMHeadModel as a Family (the mapping itself lives in tools/checkpoint/gpt2_mapping.py)."""
from tools.checkpoint import gpt2_mapping
from tools.checkpoint.hf_families.base import Family


class GPT2(Family):
    model_type = "gpt2"
    hf_class = "GPT2LMHeadModel"

    def model_flags(self, config):
        return gpt2_mapping.model_flags_from_hf(config)

    def from_hf(self, sd, config, rows):
        return gpt2_mapping.from_hf(sd, config, rows)

    def requires(self, model_args):
        return {}

    def unsupported(self, model_args):
        reasons = gpt2_mapping.unsupported_features(model_args)
        for name in ("relu", "parallel_residual", "disable_bias_attention", "output_layer_bias",
                     "rotary_interleaved"):
            if model_args.get(name):
                reasons.append(f"--{name.replace('_', '-')}=True (not GPT-2)")
        return reasons

    def hf_config(self, model_args, vocab_size, eod, dtype):
        return gpt2_mapping.hf_config(model_args, vocab_size, eod, dtype)

    def to_hf(self, params, model_args, vocab_size):
        return gpt2_mapping.to_hf(params, model_args, vocab_size)
