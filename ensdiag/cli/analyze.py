"""`ensdiag analyze`: every metric from member predictions made anywhere."""

from pathlib import Path

import typer

from ..console import check_format, note, output_file, print_json
from ..errors import EnsdiagError
from ..io import atomic_write_json
from ..quickcheck import check_inputs
from .app import app
from .options import DETAIL, FORMAT, THREADS, check_saving, claimed_file, own_threads, show_items, show_metrics

PREDICTIONS_HELP = ("A .safetensors predictions file ('<split>/logits' [k,N,C], '<split>/labels' [N]), an .npz with the "
                    "same keys (or logits/probs + labels), one .npy [k,N,C], one .npy [N,C] per member, or a .jsonl of "
                    "multiple-choice scores (one question per line).")


@app.command()
def analyze(
    sources: list[Path] = typer.Argument(..., metavar="PREDICTIONS", help=PREDICTIONS_HELP),
    labels: Path = typer.Option(None, help="Integer labels [N] (.npy) for .npy predictions."),
    ood: list[Path] = typer.Option(None, help="OOD predictions (.npy like PREDICTIONS, repeated for one file per member; "
                                              "or one .jsonl of OOD questions)."),
    inputs: str = typer.Option("logits", help="What .npy/.npz/.jsonl scores are: logits (or log-probabilities, "
                                              "log-likelihoods) or probs."),
    fmt: str = FORMAT,
    out: Path = typer.Option(None, help="Also write the metrics to this JSON file (or to metrics.json in this folder); "
                                        "with --method, the folder to save the diagnosis into."),
    method: str = typer.Option(None, help="Save as run METHOD of the folder --out (OUT/METHOD/seed-SEED/), for "
                                          "`ensdiag report OUT`; the verdict needs runs named single and deep-ensemble."),
    seed: int = typer.Option(None, help="With --method: the seed this run is saved under (default 0)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="With --method: replace the analysis already saved as "
                                   "that run; without --method, the file --out names (without it, an existing one is "
                                   "never replaced)."),
    task: str = typer.Option(None, help="lm-eval logs: the task (or group) to read, where a folder holds several."),
    ood_task: str = typer.Option(None, "--ood-task", help="lm-eval logs: the task whose questions are the OOD split "
                                 "(from the same folders, or from --ood)."),
    filter_name: str = typer.Option(None, "--filter", help="lm-eval logs: the filter whose answers to read "
                                    "(default: the first in the file, named in the output)."),
    score: str = typer.Option("loglikelihood", help="lm-eval logs: each choice's score: loglikelihood, acc_norm "
                              "(log-likelihood per character, lm-eval's) or mutual_info (minus the unconditional one)."),
    detail: bool = DETAIL,
    threads: int = THREADS,
):
    """Every metric from member predictions made anywhere.

    File layouts: docs/own-models.md ("Bring your own ensemble") and docs/llm.md (LLM ensembles).
    PREDICTIONS may be k lm-evaluation-harness runs (--log_samples), one member each: sample files or output folders;
    with --out DIR and no --method, the run's name comes from the members' model paths."""
    check_format(fmt)
    check_inputs("PREDICTIONS", sources, folders=True)
    check_inputs("--labels", [labels] if labels is not None else [])
    check_inputs("--ood", ood, folders=True)
    check_saving(out, method, seed, overwrite)
    from ..core import inspect_predictions
    from ..foreign.readers import load_any_predictions
    from ..foreign.lm_eval import LmEvalOptions, lm_eval_answers_task, looks_like_lm_eval, run_name_of

    own_threads(threads)

    options = LmEvalOptions(task, ood_task, filter_name, score)
    if all(looks_like_lm_eval(path) for path in sources) and lm_eval_answers_task(sources, options):
        # lm-eval logs of a generate_until task: answers, not choices (generated_command)
        if ood or labels is not None or inputs != "logits":
            raise EnsdiagError("generated answers (a generate_until task) hold each question's reference and lm-eval's "
                               "score: drop --ood, --labels and --inputs")
        return generated_command(sources, options, out, method, fmt, ", ".join(map(str, sources)))
    about = {}  # what the lm-eval reader found: run names, split titles, notes
    predictions, warnings = load_any_predictions(sources, labels, ood or (), inputs, options, about)
    if "lm_eval" in about and method is None and out is not None and out.suffix.lower() != ".json":
        method, seed = run_name_of(about["lm_eval"], seed)  # from the members' model paths
    if method is None and seed is not None:
        raise EnsdiagError("--seed names the run --method saves: give --method too (and --out)")
    target = None if method is not None or out is None else claimed_file(out, overwrite)  # before the analysis
    for line in [*about.get("notes", []), *(f"warning: {warning}" for warning in warnings)]:
        note(line)
    source = f"ensdiag analyze {' '.join(path.name for path in [*sources, *(ood or ())])}"
    diagnosis = inspect_predictions(predictions, ", ".join(map(str, sources)), about.get("titles"), source, detail)
    if warnings:
        diagnosis.metrics["input_warnings"] = warnings
    if "lm_eval" in about:
        diagnosis.metrics["lm_eval"] = about["lm_eval"]
    if method is not None:
        run = diagnosis.save(out, method, seed or 0, overwrite)
        note(f"saved to {run}; `ensdiag report {out}` reports every run saved there")
    elif target is not None:
        atomic_write_json(claimed_file(out, overwrite), diagnosis.metrics)
    show_metrics(diagnosis.metrics, fmt, ", ".join(map(str, sources)))


def generated_command(sources, options, out, method, fmt: str, title: str):
    """`ensdiag analyze LOGS --task NAME` on a generate_until task's logs: the answers read
    (foreign/lm_eval.py), measured (stats/generated.py) and printed (and --out FILE.json)."""
    if method is not None or (out is not None and out.suffix.lower() != ".json"):
        raise EnsdiagError("generated answers have no probabilities, so the report's tables and verdict (NLL, ECE, "
                           "diversity, OOD) do not apply to them: keep these metrics with --out FILE.json")
    from ..foreign.lm_eval import load_lm_eval_answers
    from ..report.inspection import generated_tables
    from ..stats.generated import DEFINITIONS, generated_metrics
    about = {}
    splits, warnings = load_lm_eval_answers(sources, options, about)
    for line in [*about["notes"], *(f"warning: {warning}" for warning in warnings)]:
        note(line)
    metrics = generated_metrics(splits, about["lm_eval"])
    if warnings:
        metrics["input_warnings"] = warnings
    if out is not None:
        atomic_write_json(output_file(out, "metrics.json"), metrics)
    if fmt == "json":
        print_json(metrics)
        return
    show_items(generated_tables(metrics, title), ["[low, high]: a 95 % confidence interval for the mean over the "
                                                  "task's population of questions (a bootstrap over the questions); "
                                                  + DEFINITIONS["vote_accuracy"]])
