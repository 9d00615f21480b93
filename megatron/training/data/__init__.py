"""Training data: datasets and sample schedule (datasets.py), tokenizers, the embedded corpus
(corpus.py), JSON -> .bin/.idx (preprocess.py), --task-name files (tasks.py)."""
