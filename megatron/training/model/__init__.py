"""The model: megatron-core's GPTModel (model.py), the other families (architecture.py),
attention specs, fp16 loss scaling, and the subspace-constrained model (subspace.py and its
flags)."""
