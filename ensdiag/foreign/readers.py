"""What `ensdiag analyze` reads: each kind of predictions file registered in `READERS`
(tried in the order registered, the last one the fallback), the first that recognises the paths
given reads them; every reader's result is then checked in the one place (checks.py) by the core.

    predictions, warnings = load_any_predictions(["preds.npz"], labels="labels.npy")

A reader is `read(request) -> ({split: {"logits", "labels"}}, warnings)`, registered with
`recognises(paths) -> bool` over every path given (members and --ood): lm-evaluation-harness logs,
an ensdiag .safetensors predictions file, multiple-choice JSON lines, NumPy arrays. Each refuses
in one line the options that do not apply to its files."""

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnsdiagError
from ..predictions import load_predictions
from ..registry import Registry
from .jsonl import load_jsonl_predictions
from .lm_eval import LmEvalOptions, load_lm_eval_predictions, looks_like_lm_eval
from .predictions import load_array_predictions


@dataclass
class Request:
    """What `analyze` was given, for the reader that recognises it."""

    sources: list[Path]
    labels: object = None
    ood: list[Path] = field(default_factory=list)
    inputs: str = "logits"
    lm_eval: object = None  # LmEvalOptions, or None: not given
    about: dict | None = None  # filled with what a reader knows beyond the arrays (lm-eval: titles, members)


# what it reads -> read(request) for the paths `recognises(paths)` accepts, tried in the order registered
READERS = Registry("predictions reader")


@READERS.register("lm-evaluation-harness logs", recognises=lambda paths: any(map(looks_like_lm_eval, paths)))
def _lm_eval(request: Request):
    if request.labels is not None or request.inputs != "logits":
        raise EnsdiagError(f"{request.sources[0]} looks like lm-eval logs, which hold each question's answer and "
                           "log-likelihoods: drop --labels and --inputs")
    return load_lm_eval_predictions(request.sources, request.ood, request.lm_eval or LmEvalOptions(), request.about)


@READERS.register("an ensdiag predictions file", recognises=lambda paths: paths[0].suffix == ".safetensors")
def _safetensors(request: Request):
    if len(request.sources) != 1 or request.labels is not None or request.ood or request.inputs != "logits":
        raise EnsdiagError("a .safetensors predictions file holds every member's logits, the labels and the splits "
                           "itself: pass one, and drop --labels, --ood and --inputs")
    return load_predictions(request.sources[0])[0], []


@READERS.register("multiple-choice JSON lines", recognises=lambda paths: any(p.suffix.lower() == ".jsonl" for p in paths))
def _jsonl(request: Request):
    paths = [*request.sources, *request.ood]
    if len(request.sources) != 1 or not all(path.suffix.lower() == ".jsonl" for path in paths) \
            or request.labels is not None or len(request.ood) > 1:
        raise EnsdiagError("a .jsonl file holds every member's scores and each question's answer: pass one "
                           "(no --labels), and OOD questions in it or in one --ood .jsonl")
    return load_jsonl_predictions(request.sources[0], request.ood[0] if request.ood else None, request.inputs)


@READERS.register("NumPy arrays (.npy, .npz)", recognises=lambda paths: True)
def _arrays(request: Request):
    return load_array_predictions(request.sources, request.labels, request.ood, request.inputs)


def load_any_predictions(sources, labels=None, ood=(), inputs="logits", lm_eval=None,
                         about: dict | None = None) -> tuple[dict[str, dict], list[str]]:
    """({split: {"logits", "labels"}}, warnings) from whatever `ensdiag analyze` was given, read by the
    first registered reader that recognises the paths. `lm_eval`: `LmEvalOptions` (lm-eval logs only)."""
    request = Request([Path(s) for s in sources], labels, [Path(p) for p in ood], inputs, lm_eval, about)
    if not request.sources:
        raise EnsdiagError("give at least one predictions file")
    paths = [*request.sources, *request.ood]
    what = READERS.recognise(paths)
    if what != "lm-evaluation-harness logs" and lm_eval not in (None, LmEvalOptions()):
        raise EnsdiagError("--task, --ood-task, --filter and --score are for lm-evaluation-harness logs "
                           "(samples_<task>_<date>.jsonl files or lm-eval output folders)")
    return READERS[what](request)
