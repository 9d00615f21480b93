"""The pipeline codecs a CompressionConfig selects, as the registry builds them for sizing
(megatron/cc/pp_methods: the plug-ins the driver builds its links with; no activation cache)."""
from megatron.cc.pp_methods import pp_codec


def forward_codec(c):
    return pp_codec(c, "pp-fwd")


def backward_codec(c):
    return pp_codec(c, "pp-bwd")
