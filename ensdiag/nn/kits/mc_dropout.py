"""`mc-dropout`: one network whose dropout stays on at test time; members are stochastic passes.

Placement (torch-uncertainty's, which the reference paper used) is the architectures' business:
they ask the kit for `dropout()` where it goes (nn/architectures.py).
"""

import torch.nn.functional as F
from torch import nn

from ..kit import Kit, Option, register_method


class MCDropout(nn.Module):
    """Dropout that stays on in eval mode: every pass draws a fresh mask (MC Dropout).

    `in_training=False` trains the network without dropout (a deterministic network, dropout
    only at test time, as the reference paper's text describes)."""

    def __init__(self, p, in_training=True):
        super().__init__()
        self.p, self.in_training = p, in_training

    def forward(self, x):
        return x if self.training and not self.in_training else F.dropout(x, self.p, training=True)

    def extra_repr(self):
        return f"p={self.p}, in_training={self.in_training}"


@register_method("mc-dropout")
class MCDropoutKit(Kit):
    """One network whose dropout stays active at test time; members are stochastic passes.

    Option `train_dropout`: dropout also on in training (True: torch-uncertainty's MC Dropout,
    which the reference paper's numbers came from) or off (False: the paper's text)."""

    label = "MC Dropout"
    order = 10
    declared = (Option("dropout", None, "dropout rate (default: the architecture's, the paper's 0.05 / 0.1)",
                       float, low=0.0, high=1.0, flag="--dropout"),
                Option("train_dropout", True, "dropout on in training too (torch-uncertainty) or only at test time",
                       bool))
    one_weight_set = True

    @classmethod
    def options_from(cls, config) -> dict:
        return {"dropout": config.dropout, "train_dropout": config.mc_dropout_train == "on", **super().options_from(config)}

    def dropout(self):
        return MCDropout(self.options["dropout"], in_training=self.options["train_dropout"])
