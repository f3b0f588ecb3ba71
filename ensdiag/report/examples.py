"""Every finished run's per-example predictions and uncertainty, as rows (`report --examples`)."""

from ..export import example_rows


def run_example_rows(run_dirs, probabilities: bool = False) -> list[dict]:
    """`example_rows` of every finished run of one or more run folders, each row led by its
    `method` and `seed` (the stored splits: per-corruption shift splits, not their pool)."""
    from ..seeds.loaded import PREDICTIONS, read_predictions
    from .merge import load_folders
    rows = []
    for method, seeds in load_folders(run_dirs if isinstance(run_dirs, (list, tuple)) else [run_dirs])["runs"].items():
        for seed, run in seeds.items():
            if run is None or not (run["folder"] / PREDICTIONS).is_file():  # LoRA adapters compared by weights
                continue
            predictions = read_predictions(run["folder"])
            rows += [{"method": method, "seed": seed, **row} for row in example_rows(predictions, probabilities)]
    return rows
