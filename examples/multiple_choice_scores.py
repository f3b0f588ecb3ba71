"""Multiple-choice scores of LLM ensembles as JSON lines, for `ensdiag analyze` and `ensdiag report`.

    python examples/multiple_choice_scores.py
    ensdiag analyze mc-lora-ensemble-seed0.jsonl --out runs/mc --method lora-ensemble --seed 0

**Simulated** scores, not a language model's: the point is the file format and the route to
the verdict, runnable in a second without a GPU. A benchmark of 400 four-choice questions (and
200 questions of another benchmark, as OOD) is answered, for seeds 0, 1 and 2, by
- `single`: one fine-tune (one member);
- `deep-ensemble`: four independent fine-tunes, each with its own errors;
- `lora-ensemble`: four LoRA adapters on one base model: they share the base model's errors
  and differ only by small adapter-specific ones.
Each choice's score stands for its log-likelihood under a member (only differences between a
member's choices matter: softmax over the choices). Writes mc-<method>-seed<seed>.jsonl, one
question per line, OOD questions marked "split": "ood".
"""

import json

import numpy as np

QUESTIONS, OOD_QUESTIONS, CHOICES, MEMBERS = 400, 200, 4, 4
METHODS = {"single": 1, "lora-ensemble": MEMBERS, "deep-ensemble": MEMBERS}
ERRORS = 1.7  # standard deviation of each member's score errors, the same for every method's members
ADAPTER_ERRORS = 0.5  # of those, what a LoRA adapter adds on its own; the rest comes from the shared base model

benchmark = np.random.default_rng(1234)
answers = benchmark.integers(0, CHOICES, QUESTIONS)
knowledge = benchmark.uniform(0, 4, QUESTIONS)  # how well fine-tuning taught each question


def scores_of(method, seed, signal) -> np.ndarray:
    """[members, questions, choices] log-likelihood-like scores (negative; only differences matter)."""
    rng = np.random.default_rng([seed, list(METHODS).index(method)])
    shape = (METHODS[method], *signal.shape)
    if method == "lora-ensemble":  # one base model under every adapter: its errors are every member's
        shared = rng.normal(0, np.sqrt(ERRORS**2 - ADAPTER_ERRORS**2), signal.shape)
        return signal + shared + rng.normal(0, ADAPTER_ERRORS, shape) - 5
    return signal + rng.normal(0, ERRORS, shape) - 5  # independent fine-tunes: errors of their own


def write(method, seed):
    signal = np.zeros((QUESTIONS, CHOICES))
    signal[np.arange(QUESTIONS), answers] = knowledge
    scores = scores_of(method, seed, signal)
    ood = scores_of(method, seed + 1000, np.zeros((OOD_QUESTIONS, CHOICES)))  # nothing learnt about these
    with open(f"mc-{method}-seed{seed}.jsonl", "w") as file:
        for q in range(QUESTIONS):
            row = {"id": f"q{q}", "answer": int(answers[q]), "scores": scores[:, q].round(3).tolist()}
            file.write(json.dumps(row) + "\n")
        for q in range(OOD_QUESTIONS):
            file.write(json.dumps({"id": f"ood{q}", "split": "ood", "scores": ood[:, q].round(3).tolist()}) + "\n")


for method in METHODS:
    for seed in range(3):
        write(method, seed)
print("wrote mc-{single,lora-ensemble,deep-ensemble}-seed{0,1,2}.jsonl")
