"""Optimus-CC Fig. 11: is the LEP error orthogonal to how the activations move?

On the last stage, for each backward send j: the cosine between the sender's error buffer E
(after compressing micro-batch j) and the change of the stage's input activation
x_j - x_{j-1}, plus the mean magnitude of both. Values feed ChannelStats, so they appear in
the log line at log intervals only: they stay 0-dim device tensors until then (no sync per send).
"""
import torch


class OrthogonalityProbe:
    def __init__(self, stats):
        self.stats = stats
        self.prev = None
        self.curr = None

    def activation(self, x: torch.Tensor) -> None:
        self.prev, self.curr = self.curr, x.detach().float().clone()

    def error(self, e) -> None:
        if e is None or self.prev is None or self.curr is None:
            return
        delta = (self.curr - self.prev).flatten()
        e = e.detach().float().flatten()
        # 0-dim tensors: ChannelStats converts them at the log line, not per message
        cos = torch.nn.functional.cosine_similarity(e, delta, dim=0)
        self.stats.observe("orth cos(E, dx)", cos)
        self.stats.observe("mean |E|", e.abs().mean())
        self.stats.observe("mean |dx|", delta.abs().mean())
