"""Wiring the compression library into the run: this rank's channels (channels.py,
pipeline_codecs.py), the tensor-parallel route (tp_channel.py), --compression auto
(auto_compression.py) and the end-of-run byte summary (comp_summary.py)."""
