"""What every channel uses and nothing of ours is imported by: configuration fields and their
errors, wire-byte and codec-speed accounting, the point-to-point transport, background work,
torch compatibility.

    config_fields.py  flag(): a dataclass field carrying its flag's help and bounds; ConfigError
    stats.py          ChannelStats: bytes sent and their uncompressed equivalent per channel
    speed.py          codec timing per channel (--check-comp-speed)
    transport.py      P2PTransport: batched send / receive, receives posted first
    background.py     a call on a background thread whose exception resurfaces where collected
    compat.py         torch collective renames
"""
