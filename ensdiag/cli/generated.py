"""`ensdiag analyze LOGS --task NAME` on a generate_until task (cli/analyze.py hands it here): the
answers read (foreign/lm_eval.py), measured (stats/generated.py) and printed."""

from ..console import note, output_file, print_json
from ..errors import EnsdiagError
from ..io import atomic_write_json
from .show import show_items


def generated_command(sources, options, out, method, fmt: str, title: str):
    """`ensdiag analyze` on a generate_until task's logs: read, measure, print (and --out FILE.json)."""
    if method is not None or (out is not None and out.suffix.lower() != ".json"):
        raise EnsdiagError("generated answers have no probabilities, so the report's tables and verdict (NLL, ECE, "
                           "diversity, OOD) do not apply to them: keep these metrics with --out FILE.json")
    from ..foreign.lm_eval import load_lm_eval_answers
    from ..report.generated import generated_tables
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
