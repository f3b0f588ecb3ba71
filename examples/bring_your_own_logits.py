"""Analyse an ensemble trained anywhere: write member logits to a file, run `ensdiag analyze`.

    python examples/bring_your_own_logits.py && ensdiag analyze byo-predictions.safetensors
    ensdiag analyze byo-logits.npy --labels byo-labels.npy --ood byo-ood.npy      # the same, as NumPy arrays

Three plain PyTorch MLPs (no ensdiag code) are trained on scikit-learn's digits with
different seeds; their logits on the test split (labelled) and on random noise (OOD) go
into one safetensors file in ensdiag's predictions layout:
    "<split>/logits"  float32 [k, N, C]   members first
    "<split>/labels"  int64   [N]         (omit for OOD)
and, for frameworks that speak NumPy, into .npy arrays of the same shapes.
"""

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.data / 16, digits.target, test_size=0.25, random_state=0)
x_train, x_test = torch.tensor(x_train, dtype=torch.float32), torch.tensor(x_test, dtype=torch.float32)
y_train, y_test = torch.tensor(y_train), torch.tensor(y_test)
noise = torch.rand(300, 64, generator=torch.Generator().manual_seed(0))

members = []
for seed in range(3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(300):
        loss = nn.functional.cross_entropy(net(x_train), y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    members.append(net.eval())

with torch.no_grad():
    logits = {split: torch.stack([net(x) for net in members]) for split, x in (("id", x_test), ("ood", noise))}
save_file({"id/logits": logits["id"], "id/labels": y_test.long(), "ood/logits": logits["ood"]},
          "byo-predictions.safetensors")
for name, array in (("logits", logits["id"]), ("labels", y_test.long()), ("ood", logits["ood"])):
    np.save(f"byo-{name}.npy", array.numpy())
print("wrote byo-predictions.safetensors and byo-{logits,labels,ood}.npy: now run  "
      "ensdiag analyze byo-predictions.safetensors")
