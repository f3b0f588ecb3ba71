"""`ensdiag evaluate ADAPTER_DIR… --base MODEL_DIR --tasks NAME`: lm-evaluation-harness scores
every adapter on the task (ensdiag scores no prompt itself), once per adapter, through its own
Python API with sample logging into the run folder; ensdiag then reads those logs as predictions
(foreign/lm_eval.py) and compares the adapters' weights (lora/analysis.py), and saves both parts
of one run (runs.py) for `ensdiag report`.

    OUT/<method>/seed-<seed>/
      lm-eval/member-<i>/<model>/results_<date>.json, samples_<task>_<date>.jsonl   lm-eval's own files
      metrics.json  predictions.safetensors  meta.json                            function space
      lora.json                                                                   weight space

Needs the optional extra (`pip install 'ensdiag[llm]'`: lm-eval, transformers, peft) and local
folders only: the hub is switched off (HF_HUB_OFFLINE) before lm-eval is imported, so a model or
a task's dataset that would be downloaded is a one-line error instead.
"""

import importlib.util
import os
from pathlib import Path
from unittest import mock

from ..console import note, output_folder
from ..core import inspect_predictions
from ..device import resolve_device
from ..errors import EnsdiagError
from ..foreign.lm_eval import LmEvalOptions, lm_eval_answers_task, load_lm_eval_answers, load_lm_eval_predictions
from ..foreign.lm_eval_files import check_task_name, run_name
from ..io import atomic_write_json
from ..runs import check_run_name, default_run_dir
from ..stats.generated import generated_metrics
from .analysis import diagnose_adapters, save_lora_run
from .config import read_adapter_folders

EXTRA = "pip install 'ensdiag[llm]'"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SOURCE = "ensdiag evaluate (lm-eval on LoRA adapters)"
HUB_WORDS = ("offline", "hf_hub", "huggingface.co", "connection", "couldn't reach", "localentrynotfound")


def check_extra():
    """lm-eval, transformers and peft, or one line saying how to get them."""
    missing = [name for name in ("lm_eval", "transformers", "peft") if importlib.util.find_spec(name) is None]
    if missing:
        raise EnsdiagError(f"`ensdiag evaluate ADAPTER_DIR…` runs lm-evaluation-harness, and {', '.join(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not installed: {EXTRA}")


def _failed(what: str, error: Exception) -> EnsdiagError:
    """lm-eval's, transformers' or peft's exception as one line, saying so when the hub was wanted."""
    message = " ".join(str(error).split())[:200]
    hub = any(word in f"{type(error).__name__} {message}".lower() for word in HUB_WORDS)
    why = (" (it would need the Hugging Face hub: ensdiag evaluate runs local model folders and tasks whose "
           "documents are on this machine, --include-path)") if hub else ""
    return EnsdiagError(f"{what}: {type(error).__name__}: {message}{why}")


def load_tasks(tasks: list[str], include_path):
    """lm-eval's task manager, with every task built once (their documents loaded) before any model
    is: a task that is unknown or whose documents are on the hub fails here, in one line."""
    from lm_eval.tasks import TaskManager, get_task_dict
    try:
        manager = TaskManager(include_path=str(include_path) if include_path else None)
        get_task_dict(tasks, manager)
    except Exception as error:
        raise _failed(f"lm-eval cannot load the task{'s' if len(tasks) > 1 else ''} {', '.join(tasks)}", error) from None
    return manager


def run_harness(adapter: Path, base: Path, tasks: list[str], manager, logs: Path, device: str,
                batch_size: int, limit) -> Path:
    """lm-eval on the base with one adapter (`peft=`), its results and samples written as its command
    line writes them; the model folder lm-eval wrote into."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    tracker = EvaluationTracker(output_path=str(logs))
    try:
        results = simple_evaluate(model="hf", model_args=f"pretrained={base},peft={adapter}", tasks=tasks,
                                  task_manager=manager, device=device, batch_size=batch_size, limit=limit,
                                  log_samples=True, evaluation_tracker=tracker, verbosity="WARNING")
    except Exception as error:
        raise _failed(f"lm-eval could not evaluate {adapter} on {', '.join(tasks)}", error) from None
    if results is None:
        raise EnsdiagError(f"lm-eval returned no results for {adapter}")
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:  # as lm-eval's command line does after a run
        tracker.save_results_samples(task_name=task, samples=samples[task])
    return logs / tracker.general_config_tracker.model_name_sanitized


def evaluate_adapters(folders, base, tasks: str | None, ood_task: str | None, include_path, out, method, seed: int,
                      device: str, batch_size: int, limit, not_for_adapters: dict) -> tuple[Path, dict, dict]:
    """Run lm-eval on every adapter, then save the run's two parts; (run folder, metrics, lora section)."""
    given = [option for option, value in not_for_adapters.items() if value]
    if given:
        raise EnsdiagError(f"{', '.join(given)} do{'es' if len(given) == 1 else ''} not apply to LoRA adapters: "
                           "lm-eval scores them on --tasks")
    check_extra()
    configs = read_adapter_folders(folders)
    if not tasks:
        raise EnsdiagError("name the task lm-eval scores the adapters on with --tasks NAME (a task or a group)")
    for name, option in ((tasks, "--tasks"), (ood_task, "--ood-task")):
        if name is not None:
            check_task_name(name, option)
    if base is None:
        raise EnsdiagError("give the base model's local folder with --base MODEL_DIR (lm-eval loads it with each adapter)")
    base = Path(base)
    if not (base / "config.json").is_file():
        raise EnsdiagError(f"--base {base} is not a local model folder (no config.json); ensdiag evaluate runs local "
                           "folders only, never a model from the hub")
    if include_path is not None and not Path(include_path).is_dir():
        raise EnsdiagError(f"--include-path {include_path} is not a folder of task YAML files")
    if not method:  # the adapters' common parent folder's name where it names a run (as lm-eval logs' peft paths
        found = run_name({"members": [{"peft": str(Path(folder).resolve())} for folder in folders]})  # do for analyze)
        method = found[0] if found else "lora"
    check_run_name(method, seed)
    out = output_folder(out if out is not None else default_run_dir("llm"))
    logs = out / method / f"seed-{seed}" / "lm-eval"
    if logs.exists():
        raise EnsdiagError(f"{logs} holds lm-eval logs of an earlier evaluation: save this one under another "
                           "--method or --seed, or remove that folder")
    names = [tasks, *([ood_task] if ood_task else [])]
    with mock.patch.dict(os.environ, OFFLINE):  # the hub switched off for everything imported and run inside
        manager, device = load_tasks(names, include_path), str(resolve_device(device))
        members = []
        for index, folder in enumerate(folders):
            note(f"lm-eval: adapter {index + 1} of {len(folders)} ({folder}) on {' and '.join(names)}")
            members.append(run_harness(Path(folder).resolve(), base.resolve(), names, manager, logs / f"member-{index}",
                                       device, batch_size, limit))
    return _save(out, method, seed, members, configs, base, tasks, ood_task)


def _save(out, method, seed, members, configs, base, tasks, ood_task):
    """The run's two parts: lm-eval's logs read as `analyze` reads them (a generate_until task: the answers'
    metrics as generated.json beside lm-eval's logs, and no predictions part: there are no probabilities), and
    the weight space."""
    about, options, answers = {}, LmEvalOptions(tasks, ood_task), lm_eval_answers_task(members, LmEvalOptions(tasks))
    found, warnings = (load_lm_eval_answers(members, options, about) if answers
                       else load_lm_eval_predictions(members, (), options, about))
    for line in [*about["notes"], *(f"warning: {warning}" for warning in warnings)]:
        note(line)
    if answers:
        metrics = generated_metrics(found, about["lm_eval"])
    else:
        source = f"ensdiag evaluate (lm-eval on {len(members)} LoRA adapters)"
        diagnosis = inspect_predictions(found, "lm-eval logs", about["titles"], source)  # as `analyze` reads them
        metrics = diagnosis.metrics
        metrics["lm_eval"] = about["lm_eval"]
    if warnings:
        metrics["input_warnings"] = warnings
    run = None if answers else diagnosis.save(out, method, seed)
    try:
        section = diagnose_adapters(configs, base)
    except EnsdiagError as error:  # e.g. a base saved as pytorch_model.bin: the updates alone still compare
        note(f"weight space without the base ({error})")
        section = diagnose_adapters(configs, None)
    lora_run = save_lora_run(out, method, seed, section, SOURCE)
    if answers:
        atomic_write_json(lora_run / "generated.json", metrics)
    return run or lora_run, metrics, section
