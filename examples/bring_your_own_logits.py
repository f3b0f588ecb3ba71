"""Analyse an ensemble trained anywhere: write member logits to a file, run `ensdiag analyze`.

    python examples/bring_your_own_logits.py && ensdiag analyze byo-predictions.safetensors
    ensdiag analyze byo-logits.npy --labels byo-labels.npy --ood byo-ood.npy      # the same, as NumPy arrays

Three plain PyTorch MLPs (no ensdiag code) are trained on scikit-learn's digits with
different seeds; their logits on the test split (labelled) and on patches of the two
photographs that ship with scikit-learn (OOD: natural images, not digits, scaled like them)
go into one safetensors file in ensdiag's predictions layout:
    "<split>/logits"  float32 [k, N, C]   members first
    "<split>/labels"  int64   [N]         (omit for OOD)
and, for frameworks that speak NumPy, into .npy arrays of the same shapes.
"""

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits, load_sample_images
from sklearn.model_selection import train_test_split
from torch import nn

digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.data / 16, digits.target, test_size=0.25, random_state=0)
x_train, x_test = torch.tensor(x_train, dtype=torch.float32), torch.tensor(x_test, dtype=torch.float32)
y_train, y_test = torch.tensor(y_train), torch.tensor(y_test)

def photo_patches(n=300, seed=0):
    """n grey 32×32 crops of scikit-learn's sample photographs, averaged down to 8×8 in [0, 1]."""
    generator = np.random.default_rng(seed)
    greys = [image.mean(axis=2) / 255 for image in load_sample_images().images]
    patches = []
    for i in range(n):
        grey = greys[i % len(greys)]
        top, left = generator.integers(0, grey.shape[0] - 32), generator.integers(0, grey.shape[1] - 32)
        patches.append(grey[top:top + 32, left:left + 32].reshape(8, 4, 8, 4).mean(axis=(1, 3)).ravel())
    return torch.tensor(np.stack(patches), dtype=torch.float32)


ood = photo_patches()

members = []
for seed in range(3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    # weight decay keeps the members from being certain about everything: without it their
    # max-softmax is ~1 on photographs too and the OOD AUROC drops to chance (0.5) or below
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=1e-3)
    for step in range(300):
        loss = nn.functional.cross_entropy(net(x_train), y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    members.append(net.eval())

with torch.no_grad():
    logits = {split: torch.stack([net(x) for net in members]) for split, x in (("id", x_test), ("ood", ood))}
save_file({"id/logits": logits["id"], "id/labels": y_test.long(), "ood/logits": logits["ood"]},
          "byo-predictions.safetensors")
for name, array in (("logits", logits["id"]), ("labels", y_test.long()), ("ood", logits["ood"])):
    np.save(f"byo-{name}.npy", array.numpy())
print("wrote byo-predictions.safetensors and byo-{logits,labels,ood}.npy: now run  "
      "ensdiag analyze byo-predictions.safetensors")
