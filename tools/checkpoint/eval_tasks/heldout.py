"""Data of the shipped offline tasks, for lm-eval's `custom_dataset`: the .jsonl files beside
this file, found from here, so the tasks run from any working directory and never reach the
Hugging Face hub (make_data.py wrote the files and says why the text is held out)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    import datasets
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def continuation(**_metadata):
    """heldout_continuation: {"context", "choices", "label", "source"} rows."""
    return _load("heldout_continuation.jsonl")


def text(**_metadata):
    """heldout_perplexity: {"text", "source"} rows."""
    return _load("heldout_text.jsonl")
