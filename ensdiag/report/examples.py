"""Every finished run's per-example predictions and uncertainty, as rows (`report --examples`)."""

from ..export import example_rows


def run_example_rows(run_dirs, probabilities: bool = False) -> list[dict]:
    """`example_rows` of every finished run of one or more run folders, each row led by its
    `method` and `seed` (the stored splits: per-corruption shift splits, not their pool)."""
    from ..predictions import load_predictions
    from .merge import load_folders
    rows = []
    for method, seeds in load_folders(run_dirs if isinstance(run_dirs, (list, tuple)) else [run_dirs])["runs"].items():
        for seed, run in seeds.items():
            path = run["folder"] / "predictions.safetensors" if run is not None else None
            if path is None or not path.is_file():  # LoRA adapters compared by weights: no predictions
                continue
            predictions, _ = load_predictions(path)
            rows += [{"method": method, "seed": seed, **row} for row in example_rows(predictions, probabilities)]
    return rows
