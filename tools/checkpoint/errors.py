"""The two ways a checkpoint tool refuses; both carry a message naming the file or the flag."""


class CheckpointError(Exception):
    """A checkpoint that cannot be read or converted; the message names the file and the fix."""


class ConversionError(Exception):
    """The model cannot be expressed in the other format; the message names the flag."""
