"""What `ensdiag analyze` reads: one entry that tells the predictions files apart and hands each to
its reader (safetensors, lm-evaluation-harness logs, multiple-choice JSON lines, NumPy arrays);
every reader's result is then checked in the one place (checks.py) by the core."""

from pathlib import Path

from ..errors import EnsdiagError
from .predictions import INPUTS, load_array_predictions


def load_any_predictions(sources, labels=None, ood=(), inputs="logits", lm_eval=None,
                         about: dict | None = None) -> tuple[dict[str, dict], list[str]]:
    """({split: {"logits", "labels"}}, warnings) from whatever `ensdiag analyze` was given: an
    ensdiag .safetensors predictions file, lm-evaluation-harness logs (foreign/lm_eval.py: sample
    files or output folders, one member each, read with the `LmEvalOptions` `lm_eval`), a .jsonl
    of multiple-choice scores (foreign/jsonl.py), or .npy / .npz arrays. `about`, if given, is
    filled with what a reader knows beyond the arrays (lm-eval: split titles, members)."""
    sources, ood = [Path(s) for s in sources], [Path(p) for p in ood]
    if inputs not in INPUTS:
        raise EnsdiagError(f"--inputs must be logits or probs, got {inputs!r}")
    from .lm_eval import LmEvalOptions, load_lm_eval_predictions, looks_like_lm_eval
    if any(looks_like_lm_eval(path) for path in [*sources, *ood]):
        if labels is not None or inputs != "logits":
            raise EnsdiagError(f"{sources[0]} looks like lm-eval logs, which hold each question's answer and "
                               "log-likelihoods: drop --labels and --inputs")
        return load_lm_eval_predictions(sources, ood, lm_eval or LmEvalOptions(), about)
    if lm_eval is not None and lm_eval != LmEvalOptions():
        raise EnsdiagError("--task, --ood-task, --filter and --score are for lm-evaluation-harness logs "
                           "(samples_<task>_<date>.jsonl files or lm-eval output folders)")
    if len(sources) == 1 and sources[0].suffix == ".safetensors":
        from ..predictions import load_predictions
        if labels is not None or ood or inputs != "logits":
            raise EnsdiagError("a .safetensors predictions file holds logits, labels and splits itself; "
                               "drop --labels, --ood and --inputs")
        return load_predictions(sources[0])[0], []
    is_jsonl = [path.suffix.lower() == ".jsonl" for path in [*sources, *ood]]
    if any(is_jsonl):
        from .jsonl import load_jsonl_predictions
        if len(sources) != 1 or not all(is_jsonl) or labels is not None or len(ood) > 1:
            raise EnsdiagError("a .jsonl file holds every member's scores and each question's answer: pass one "
                               "(no --labels), and OOD questions in it or in one --ood .jsonl")
        return load_jsonl_predictions(sources[0], ood[0] if ood else None, inputs)
    return load_array_predictions(sources, labels, ood, inputs)
