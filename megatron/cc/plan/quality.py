"""Expected quality cost of a compression scheme: this project's measured validation-loss gaps.

Each entry is a gap in percent of final validation loss against the uncompressed run of the
same benchmark invocation, with where it was measured. The demo-scale numbers are what we have;
a planner at another scale should read them as an ordering, not a promise. The gaps of the
channels a scheme compresses are added (an assumption: each is small and they were measured one
at a time). A scheme with no measurement has no quality cost to offer: the planner leaves it
out whenever a budget is given (None below).
"""
from typing import Optional

# (gap %, source)
GAPS = {
    # pipeline activations, fine-tuning at pp=2 with bwd fixpoint-8 (docs/finetune.md,
    # "Results"; bench/results/activation_compression.md)
    "fwd fixpoint-4 + bwd fixpoint-8": (0.03, "bench/results/activation_compression.md"),
    "fwd fixpoint-2 + bwd fixpoint-8": (0.36, "bench/results/activation_compression.md"),
    "fwd delta-4 + bwd fixpoint-8": (0.02, "bench/results/activation_compression.md"),
    "fwd delta-2 + bwd fixpoint-8": (0.27, "bench/results/activation_compression.md"),
    "fwd tah-4/3 + bwd fixpoint-8": (0.04, "bench/results/activation_compression.md"),
    # Optimus-CC at pp=4 x dp=2 (docs/pipeline_compression.md, "Optimus-CC results")
    "Optimus-CC CB (epilogue, LEP, flush) + FE + SC": (0.77,
                                                       "bench/results/optimus_cc_after_fixes.md"),
    "Optimus-CC CB on every send + FE + SC": (9.99, "bench/results/optimus_cc_after_fixes.md"),
    # dp channel (docs/data_parallel.md, bench/results/dp_modes*.md)
    # measured at rank 8 on the demo's hidden 128; the planner runs the paper's rank 128
    "SC PowerSGD on every stage": (0.35, "bench/results/dp_modes.md (powersgd)"),
    "CocktailSGD 0.125/1/2 + Adam correction": (1.90, "bench/results/dp_modes_warm_b128"),
    "DiLoCo H=50 int8 + Adam correction": (1.65, "bench/results/dp_modes_warm_b128"),
    "SparseLoCo H=15": (6.45, "bench/results/dp_modes_warm_b128_sparseloco (+Adam correction)"),
}


def gap(name: str) -> Optional[float]:
    """Measured gap in percent for a named component (0 for 'none'), None if unmeasured."""
    if name == "none":
        return 0.0
    if name not in GAPS:
        raise KeyError(f"no quality entry {name!r}; known: {sorted(GAPS)}")
    return GAPS[name][0]


def total_gap(names) -> Optional[float]:
    """Sum of the components' gaps; None when any is unmeasured."""
    total = 0.0
    for n in names:
        g = gap(n)
        if g is None:
            return None
        total += g
    return total
