"""ensdiag's Python API in a dozen lines: build, run, inspect members, save, reload, analyse.

    python examples/python_api.py
"""

import torch

import ensdiag
from ensdiag.analysis import analyze_predictions

model = ensdiag.build_model("mlp", "batch-ensemble", num_members=4, num_classes=10, input_shape=(1, 28, 28))
x = torch.randn(32, 1, 28, 28)
logits = model(x)  # [k, B, C]: every member sees x
print("logits", tuple(logits.shape))

weights = model.member_weights()  # per member: effective dense weights W ∘ r sᵀ
print("member 0 layers:", {name: tuple(w.shape) for name, w in weights[0].items()})

ensdiag.save_model(model, "api-model.safetensors")
reloaded = ensdiag.load_model("api-model.safetensors")
assert torch.equal(reloaded(x), model.eval()(x))

labels = torch.randint(0, 10, (32,))
result = analyze_predictions({"id": {"logits": logits.detach(), "labels": labels}}, weights=weights)
print("weight cosine at initialisation (≈ 0.64 expected for Normal(1, 0.5)):",
      round(result["analyzers"]["weight-similarity"]["mean"]["value"], 3))
