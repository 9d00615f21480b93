"""Schedules over the run: learning rate (lr_schedule.py) and global batch size
(batch_rampup.py)."""
