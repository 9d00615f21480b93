"""The parameter-syncing dp modes' checkpoint component (the modes themselves are plug-ins in
megatron/cc/data_parallel/)."""


class ReplicaState:
    """Checkpoint component: this rank's own weights and optimizer state.

    In the parameter-syncing modes the replicas differ between syncs (CocktailSGD's worker
    error lives in the weights, DiLoCo's inner steps, gossip averaging), while the model file
    holds dp rank 0's copy only; without this a resumed replica would restart from another
    replica's weights. fp32 only (the modes reject --fp16/--bf16).
    """

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from megatron.training.checkpointing.save_load import named_optimizer_state
        return {"params": {n: p.detach().clone() for n, p in self.model.named_parameters()},
                "optimizer": named_optimizer_state(self.optimizer, self.model)}

    def load_state_dict(self, sd: dict) -> None:
        import torch
        from megatron.training.checkpointing.save_load import load_named_optimizer_state
        if not sd:
            return
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(sd["params"][n])
        load_named_optimizer_state(self.optimizer, self.model, sd["optimizer"])
