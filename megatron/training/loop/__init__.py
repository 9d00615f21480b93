"""The training loop (training.py: one Trainer whose methods each do one step of Megatron's
pretrain()) and the run's log directory (run_log.py)."""
