"""Pretraining-data pipeline: URL blacklisting, cleanup, MinHash dedup, 13-gram decontamination (see README.md)."""
