"""Scale (issue 46): k = 5 members × MMLU's size — 57 subtasks, 14,042 four-choice questions, in
lm-eval 0.4.13's nested group layout (mmlu → 4 categories → 57 subjects) — read and analysed by
ensdiag, against the time it takes merely to parse the same JSON lines.

    python benchmarks/lm_eval_scale.py            # writes benchmarks/results/lm-eval-scale-cpu-<time>.json
    python benchmarks/lm_eval_scale.py --keep DIR # and leaves the logs in DIR (else a temporary folder)

The logs are synthetic but in lm-eval's own layout, field for field as lm-eval writes them
(a line of tests/fixtures/lm_eval/out/numbers, MMLU's template and its `doc_to_target: answer`,
`doc_to_choice: ["A", "B", "C", "D"]`): per subject MMLU's number of test questions, about
3.4 KB per line (a question of ~300 characters, its four choices, the prompt repeated in each of
the four requests), members whose log-likelihoods share each question's difficulty, and
results_*.json with every subtask's and group's acc, aggregated by size as lm-eval does.

Timed, each step the median of `ROUNDS` rounds taken in turn: `parse` —
`json.loads` of every line of every samples file (the floor: any reader parses them); `read` —
`load_lm_eval_predictions` (lines checked, targets read as lm-eval reads them and checked
against its logged acc, members joined, the groups aggregated with their intervals);
`analyzers` — every analyzer's numbers on the pooled split and on each of the 57 subtasks (the
conformal sets included); `intervals` — the core's intervals of the headline numbers
(`inspect_predictions` is these two); `analyze` — both as `inspect_predictions` runs them
(`core/analyzed.py`: each analyzer with its intervals, in forked processes where the work is
large; the metrics checked equal to the two steps'). The files are read as `load_lm_eval_predictions`
reads them (forked where large: `lm_eval.py`). The record keeps the load average before and after (the
machine is shared), torch's thread count, and the peak memory of the process; the check before
allocation is `ensdiag/budget.py`'s (the reader asks it whenever the questions read double).
"""

import argparse
import hashlib
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEMBERS = 5
ROUNDS = 3
# MMLU's test questions per subject and lm-eval 0.4.13's category of each (lm_eval/tasks/mmlu/default)
SUBJECTS = {
    "abstract_algebra": ("stem", 100), "anatomy": ("stem", 135), "astronomy": ("stem", 152),
    "business_ethics": ("other", 100), "clinical_knowledge": ("other", 265), "college_biology": ("stem", 144),
    "college_chemistry": ("stem", 100), "college_computer_science": ("stem", 100), "college_mathematics": ("stem", 100),
    "college_medicine": ("other", 173), "college_physics": ("stem", 102), "computer_security": ("stem", 100),
    "conceptual_physics": ("stem", 235), "econometrics": ("social_sciences", 114), "electrical_engineering": ("stem", 145),
    "elementary_mathematics": ("stem", 378), "formal_logic": ("humanities", 126), "global_facts": ("other", 100),
    "high_school_biology": ("stem", 310), "high_school_chemistry": ("stem", 203),
    "high_school_computer_science": ("stem", 100), "high_school_european_history": ("humanities", 165),
    "high_school_geography": ("social_sciences", 198), "high_school_government_and_politics": ("social_sciences", 193),
    "high_school_macroeconomics": ("social_sciences", 390), "high_school_mathematics": ("stem", 270),
    "high_school_microeconomics": ("social_sciences", 238), "high_school_physics": ("stem", 151),
    "high_school_psychology": ("social_sciences", 545), "high_school_statistics": ("stem", 216),
    "high_school_us_history": ("humanities", 204), "high_school_world_history": ("humanities", 237),
    "human_aging": ("other", 223), "human_sexuality": ("social_sciences", 131), "international_law": ("humanities", 121),
    "jurisprudence": ("humanities", 108), "logical_fallacies": ("humanities", 163), "machine_learning": ("stem", 112),
    "management": ("other", 103), "marketing": ("other", 234), "medical_genetics": ("other", 100),
    "miscellaneous": ("other", 783), "moral_disputes": ("humanities", 346), "moral_scenarios": ("humanities", 895),
    "nutrition": ("other", 306), "philosophy": ("humanities", 311), "prehistory": ("humanities", 324),
    "professional_accounting": ("other", 282), "professional_law": ("humanities", 1534),
    "professional_medicine": ("other", 272), "professional_psychology": ("social_sciences", 612),
    "public_relations": ("social_sciences", 110), "security_studies": ("social_sciences", 245),
    "sociology": ("social_sciences", 201), "us_foreign_policy": ("social_sciences", 100), "virology": ("other", 166),
    "world_religions": ("humanities", 171)}
CATEGORIES = ("stem", "other", "social_sciences", "humanities")  # lm-eval's order in mmlu's group YAML
WORDS = "the of a model which value is given when two three force energy law court state market cell theory " \
        "number function process system rate data test case point area light group change form".split()
DATE = "2026-11-27T00-00-00.000000"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sentence(rng, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()


def documents(subjects: dict, seed: int = 46) -> dict:
    """{subject: [(doc, context, difficulty [4])]}, the same for every member."""
    rng, found = random.Random(seed), {}
    for subject, (_, size) in subjects.items():
        rows = []
        for _ in range(size):
            doc = {"question": _sentence(rng, 50) + "?", "subject": subject,
                   "choices": [_sentence(rng, 6) for _ in range(4)], "answer": rng.randrange(4)}
            context = (f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
                       f"{doc['question']}\nA. {doc['choices'][0]}\nB. {doc['choices'][1]}\nC. {doc['choices'][2]}\n"
                       f"D. {doc['choices'][3]}\nAnswer:")
            base = [rng.gauss(-2.0, 1.0) for _ in range(4)]
            base[doc["answer"]] += 1.2  # the answer is likelier: members are better than chance
            rows.append((doc, context, base))
        found[subject] = rows
    return found


def write_member(folder: Path, member: int, docs: dict, subjects: dict) -> None:
    rng = random.Random(1000 + member)
    folder.mkdir(parents=True)
    results, configs = {}, {}
    for subject, rows in docs.items():
        correct = 0
        with open(folder / f"samples_mmlu_{subject}_{DATE}.jsonl", "w") as handle:
            for doc_id, (doc, context, base) in enumerate(rows):
                lls = [value + rng.gauss(0.0, 0.8) for value in base]
                acc = float(max(range(4), key=lambda i: (lls[i], -i)) == doc["answer"])
                correct += acc
                answers = [[repr(ll), "False"] for ll in lls]
                line = {"doc_id": doc_id, "doc": doc, "target": str(doc["answer"]),
                        "arguments": {f"gen_args_{i}": {"arg_0": context, "arg_1": f" {letter}"}
                                      for i, letter in enumerate("ABCD")},
                        "resps": [[answer] for answer in answers], "filtered_resps": answers, "filter": "none",
                        "metrics": ["acc"], "doc_hash": _sha(json.dumps(doc, indent=2, ensure_ascii=False)),
                        "prompt_hash": _sha(context), "target_hash": _sha(str(doc["answer"])), "acc": acc}
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        results[f"mmlu_{subject}"] = {"alias": subject, "sample_len": len(rows), "acc,none": correct / len(rows)}
        configs[f"mmlu_{subject}"] = {"task": f"mmlu_{subject}", "output_type": "multiple_choice", "test_split": "test",
                                      "doc_to_text": "{{question.strip()}}\nA. …\nAnswer:", "doc_to_target": "answer",
                                      "doc_to_choice": ["A", "B", "C", "D"], "target_delimiter": " ",
                                      "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    tree = {"mmlu": [f"mmlu_{category}" for category in CATEGORIES]}
    tree.update({f"mmlu_{category}": [f"mmlu_{s}" for s, (c, _) in subjects.items() if c == category]
                 for category in CATEGORIES})
    tree = {group: leaves for group, leaves in tree.items() if leaves}
    tree["mmlu"] = [group for group in tree["mmlu"] if group in tree]
    groups = {}
    for group in ["mmlu", *tree["mmlu"]]:
        leaves = [leaf for leaf in sum(tree.values(), []) if leaf.startswith("mmlu_") and leaf in results
                  and (group == "mmlu" or leaf in tree[group])]
        sizes = [results[leaf]["sample_len"] for leaf in leaves]
        value = sum(results[leaf]["acc,none"] * size for leaf, size in zip(leaves, sizes)) / sum(sizes)
        groups[group] = {"alias": group, "sample_len": sum(sizes), "acc,none": value}
    results.update(groups)
    record = {"results": results, "groups": groups, "group_subtasks": tree, "configs": configs,
              "config": {"model": "hf", "model_args": f"pretrained=base,peft=bench/adapter-{member}"},
              "lm_eval_version": "0.4.13"}
    (folder / f"results_{DATE}.json").write_text(json.dumps(record))


def write_logs(out: Path, subjects: dict = SUBJECTS) -> list[Path]:
    docs = documents(subjects)
    folders = [out / f"bench__adapter-{member}" for member in range(MEMBERS)]
    for member, folder in enumerate(folders):
        write_member(folder, member, docs, subjects)
    return folders


def parse_only(folders) -> int:
    lines = 0
    for folder in folders:
        for path in sorted(folder.glob("samples_*.jsonl")):
            with open(path, "rb") as handle:
                for line in handle:
                    json.loads(line)
                    lines += 1
    return lines


def read(folders):
    from ensdiag.foreign.lm_eval import LmEvalOptions, load_lm_eval_predictions
    about = {}
    predictions, warnings = load_lm_eval_predictions(folders, (), LmEvalOptions("mmlu"), about)
    return predictions, about


def analyse(predictions):
    """What `inspect_predictions` does (core/inspection.py): its two parts timed apart in this process
    (every analyzer's numbers on every split, then the intervals of the headline numbers), then both
    as it runs them (`core.analyzed`: each analyzer with its intervals, over forked processes where the
    work is large). ({seconds}, metrics, processes)."""
    from ensdiag.analysis import analyze_predictions
    from ensdiag.checks import check_predictions
    from ensdiag.core import analyzed as A
    from ensdiag.core.intervals import add_intervals
    from ensdiag.predictions import with_pooled_shift
    began = time.perf_counter()
    checked = with_pooled_shift(check_predictions(predictions, "bench"))
    metrics = analyze_predictions(checked)
    middle = time.perf_counter()
    add_intervals(metrics, checked)
    ended = time.perf_counter()
    checked = with_pooled_shift(check_predictions(predictions, "bench"))
    found = A.analyzed(checked)
    seconds = {"analyzers": middle - began, "intervals": ended - middle, "analyze": time.perf_counter() - ended}
    assert json.dumps(found, default=str) == json.dumps(metrics, default=str), "the forked analyzers' metrics differ"
    return seconds, metrics, A.processes_for(A.without_ood_labels(checked), len(A.predictions_analyzers()))


def peak_memory() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reader_processes(files: int) -> int:
    """The processes `load_lm_eval_predictions` reads these logs with (lm_eval.py: the first file in
    its own, the rest forked where they are large and the machine has the cores)."""
    from ensdiag import forked
    from ensdiag.foreign import lm_eval
    return forked.workers(files - 1, lm_eval.MAX_READERS)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--subjects", type=int, default=len(SUBJECTS), help="the first N subjects only (a quick try)")
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    if args.threads:
        __import__("torch").set_num_threads(args.threads)
    subjects = dict(list(SUBJECTS.items())[:args.subjects])
    from ensdiag.io import atomic_write_json
    from ensdiag.provenance import environment
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        began = time.perf_counter()
        folders = write_logs(folder, subjects)
        written = time.perf_counter() - began
        size = sum(p.stat().st_size for f in folders for p in f.glob("samples_*.jsonl"))
        load_before = os.getloadavg()
        times = {"parse": [], "read": [], "analyzers": [], "intervals": [], "analyze": []}
        parse_only(folders)  # the files in the page cache for every round alike
        for _ in range(args.rounds):
            began = time.perf_counter()
            lines = parse_only(folders)
            times["parse"].append(time.perf_counter() - began)
            began = time.perf_counter()
            predictions, about = read(folders)
            times["read"].append(time.perf_counter() - began)
            seconds, metrics, processes = analyse(predictions)
            for step, value in seconds.items():
                times[step].append(value)
        load_after = os.getloadavg()
    median = {step: statistics.median(values) for step, values in times.items()}
    groups = about["lm_eval"]["groups"]["groups"]
    conformal = metrics["analyzers"]["conformal"]["scores"]
    record = {"kind": "lm-eval-scale", "created": datetime.now().isoformat(timespec="seconds"),
              "command": ["python", "benchmarks/lm_eval_scale.py", *(argv or sys.argv[1:])],
              "environment": environment(__import__("torch").device("cpu")),
              "settings": {"members": MEMBERS, "subtasks": len(subjects), "questions": sum(n for _, n in subjects.values()),
                           "choices": 4, "lines": lines, "bytes": size, "rounds": args.rounds,
                           "groups": {name: entry["n"] for name, entry in groups.items()}},
              "seconds": {**median, "write_logs": written},
              "samples": times,
              "ratio_to_parse": {"read": median["read"] / median["parse"],
                                 "read_and_analyzers": (median["read"] + median["analyzers"]) / median["parse"],
                                 "read_analyzers_and_intervals": sum(median[s] for s in ("read", "analyzers", "intervals"))
                                 / median["parse"], "read_and_analyze": (median["read"] + median["analyze"]) / median["parse"]},
              "target_ratio": 3.0, "torch_threads": __import__("torch").get_num_threads(),
              "reader_processes": reader_processes(MEMBERS * len(subjects)), "analyzer_processes": processes,
              "load_average": {"before": list(load_before), "after": list(load_after)},
              "peak_memory_bytes": peak_memory(),
              "mmlu_accuracy": {"ensemble": groups["mmlu"]["accuracy"]["value"],
                                "members": groups["mmlu"]["member_accuracy"]["value"],
                                "members_lm_eval": groups["mmlu"]["lm_eval"]},
              "conformal_lac": {"coverage": conformal["lac"]["coverage"]["value"],
                                "set_size": conformal["lac"]["set_size"]["value"]},
              "splits_analysed": len(metrics["splits"])}
    stamp = record["created"].replace(":", "").replace("-", "")
    path = args.out / f"lm-eval-scale-cpu-{stamp}.json"
    atomic_write_json(path, record)
    print(json.dumps({key: record[key] for key in ("seconds", "ratio_to_parse", "load_average", "peak_memory_bytes")},
                     indent=1, ensure_ascii=False))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
