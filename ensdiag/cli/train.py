"""`ensdiag train`: every method × seed of a preset into a run folder (experiment.py does the work)."""

import sys
from pathlib import Path

import typer

from ..config import PRESETS, TrainConfig, preset_config  # torch-free: the presets' names for the help
from ..console import err_console, loading, note, show
from ..errors import EnsdiagError
from ..io import is_path
from ..numbers import integer_list
from ..quickcheck import check_train
from ..runs import default_run_dir, read_experiment
from ..text import terminal
from .app import app, csv_list
from .options import THREADS, own_threads


@app.command()
def train(
    preset: str = typer.Option("digits", help=f"The protocol: {', '.join(PRESETS)} (digits is embedded and runs offline; "
                                "`ensdiag presets` shows each one's defaults)."),
    method: str = typer.Option(None, help="Comma list of methods (`ensdiag models` lists every registered one; default: the preset's)."),
    seeds: str = typer.Option(None, help="Comma list of seeds (default: the preset's, `ensdiag presets`)."),
    epochs: int = typer.Option(None, help="Maximum epochs."),
    lr: float = typer.Option(None, help="Initial learning rate."),
    batch_size: int = typer.Option(None, help="Examples per batch (per member for Deep Ensembles)."),
    members: int = typer.Option(None, "--members", "-k", help="Ensemble members k (and MC Dropout passes)."),
    dropout: float = typer.Option(None, help="MC Dropout rate."),
    mc_dropout_train: str = typer.Option(None, help="MC Dropout in training: on (torch-uncertainty's, which the paper's numbers came from; the presets) or off (dropout only at test time, as the paper's text says)."),
    be_variant: str = typer.Option(None, help="BatchEnsemble conv perturbation: channel or kernel."),
    be_init: str = typer.Option(None, help="Fast-weight init: normal[:std], ones, random-sign[:p]."),
    be_layout: str = typer.Option(None, help="BatchEnsemble layout: paper (random member biases, biased block convs, plain shortcuts; the presets) or original (zero biases, every conv perturbed)."),
    be_loss: str = typer.Option(None, help="BatchEnsemble loss: mean (cross-entropy over all k·B rows, the original's; default) or sum (over members, which gives the shared weights k times a single model's gradient)."),
    be_split_batch: bool = typer.Option(None, "--be-split-batch/--no-be-split-batch", help="Original split mode: each member gets B/k examples."),
    be_fast_weight_decay: bool = typer.Option(None, "--be-fast-weight-decay/--no-be-fast-weight-decay", help="Weight decay on r, s (paper: on)."),
    early_stopping: bool = typer.Option(None, "--early-stopping/--no-early-stopping",
                                        help="Stop when validation accuracy stops improving and keep the best epoch's weights (digits, mnist: on; cifar10: off)."),
    patience: int = typer.Option(None, help="Early stopping: epochs without an improvement of min_delta before stopping (preset: 10)."),
    val_fraction: float = typer.Option(None, help="Fraction of the training set held out for validation, seeded (digits, mnist: 0.1; cifar10: 0, the full training set)."),
    ddp: bool = typer.Option(False, "--ddp", help="Under torchrun: train each run on all ranks together "
                             "(DistributedDataParallel) instead of spreading the runs over the ranks."),
    geometry: bool = typer.Option(None, "--geometry/--no-geometry", help="Member geometry after training: CKA per "
                                  "layer, aligned weight cosine, paths between members, rank of W_i ⊘ W_j (default on)."),
    detail: bool = typer.Option(None, "--detail/--no-detail", help="Each run's diagnosis also computes the detail "
                                "catalogue (SmoothECE and the calibration table, debiased ECE, temperature scaling, "
                                "selective prediction, conformal sets, member pairs) with its intervals; by default "
                                "the runs compute what the report's headline reads (docs/conventions.md)."),
    track_diversity: bool = typer.Option(None, "--track-diversity/--no-track-diversity",
                                         help="Record members' disagreement, JSD and weight cosine (raw and aligned) on the "
                                         "validation split at initialisation and after every epoch (diversity.jsonl)."),
    method_option: list[str] = typer.Option(None, "--option", "-O", metavar="METHOD.NAME=VALUE",
                                            help="A method's option (repeatable); `ensdiag models --options` lists them all."),
    precision: str = typer.Option(None, help="Training arithmetic: auto (bf16 autocast on CUDA, fp32 on the CPU), fp32 "
                                  "or bf16. Predictions and every metric are computed in fp32 whatever this says."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    data_dir: Path = typer.Option(Path("data"), "--data-dir", help="Where datasets live (torchvision's layout)."),
    download: bool = typer.Option(False, "--download", help="Let torchvision download MNIST/FashionMNIST/CIFAR-10/SVHN."),
    shift: str = typer.Option(None, help="Replace the preset's shift set: a registered dataset (`ensdiag datasets`) or "
                              "your files (an image folder, .npz or .npy)."),
    ood: str = typer.Option(None, help="Replace the preset's OOD set: a registered dataset or your files, like --shift."),
    out: Path = typer.Option(None, help="Run folder (default runs/<preset>-<timestamp>); rerun into it to resume."),
    resume: Path = typer.Option(None, help="Continue the run in this folder with its stored settings."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="After training, also print the verdict and the "
                                 "in-distribution, OOD and diversity tables (`ensdiag report RUN_DIR` prints them all)."),
    threads: int = THREADS,
):
    """Train every method × seed of a preset into a run folder.

    Writes models, predictions and metrics per run; rerun into the folder to resume."""
    options = dict(methods=csv_list(method), seeds=integer_list(seeds, "--seeds"), epochs=epochs, lr=lr,
                   batch_size=batch_size, members=members, dropout=dropout, mc_dropout_train=mc_dropout_train, be_variant=be_variant,
                   be_init=be_init, be_layout=be_layout, be_loss=be_loss, be_split_batch=be_split_batch, be_fast_weight_decay=be_fast_weight_decay,
                   early_stopping=early_stopping, patience=patience, val_fraction=val_fraction,
                   track_diversity=track_diversity, geometry=geometry, detail=detail, precision=precision, method_options=method_option or None,
                   shift=shift, ood=ood)
    if resume is not None:
        given = sorted(key for key, value in options.items() if value is not None)
        if given or out is not None:
            raise EnsdiagError(f"--resume continues a run with its stored settings; drop {', '.join(given) or '--out'}")
    check_train(preset, options["methods"], out, resume, shift, ood)  # before torch: a typo costs well under a second
    with loading("loading torch …", quiet):  # a transient line: gone once training shows its progress
        from ..distributed import finish, from_environment, ranks
        from ..experiment import run_experiment
        from ..nn.methods import parse_method_options
        from ..report import make_report, to_rich

    options.update(method_options=parse_method_options(method_option) if method_option else None, shift=_set(shift),
                   ood=_set(ood))
    if resume is not None:
        config, out = TrainConfig.from_dict(read_experiment(resume)["config"], source=str(resume / "experiment.json")), resume
    else:
        config = preset_config(preset, **options)
        if out is None and from_environment().distributed:
            raise EnsdiagError("under torchrun, name the run folder with --out: every rank must write the same one")
        out = out or default_run_dir(config.preset)
    own_threads(threads, config.arch)
    try:
        run_dir = run_experiment(config, out, data_dir, download, device, quiet, sys.argv, ddp=ddp)
    finally:
        finish()
    if not ranks().main:
        return  # rank 0 reports for the whole job
    # the grid's report, written once every run (every rank's) has finished: `ensdiag report` reads it back
    summary = None
    try:
        with loading("writing the report (the verdict's bootstrap, figures) …", quiet):
            summary = make_report(run_dir)
    except EnsdiagError as error:  # the grid trained: its report can be made again
        note(f"warning: the grid trained, but its report was not written ({error}); `ensdiag report {terminal(run_dir)}` "
             "tries again")
    if verbose and not quiet and summary is not None:  # the tables are the report's: by default train ends with where they are
        for table in to_rich(summary, only={"verdict", "effective-size", "id", "ood", "diversity"},
                             width=err_console.width):
            show(err_console, table)
    if not quiet:
        note(f"run folder: {run_dir}  (the answer: ensdiag report {run_dir} --format summary; every table: "
             f"ensdiag report {run_dir})")
    print(terminal(run_dir))


def _set(value):
    """A --shift/--ood value as stored in the run: a dataset name as given, files as an absolute path."""
    if value is None:
        return None
    return str(Path(value).resolve()) if is_path(value) else value
