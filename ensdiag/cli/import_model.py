"""`ensdiag import`: an ensemble trained elsewhere, converted once to an ensdiag model file."""

import json
from pathlib import Path

import typer

from ..console import note, output_file
from ..quickcheck import check_inputs
from ..text import terminal
from .app import app
from .options import ARCH, FAMILY, NUM_CLASSES, SOURCES_HELP


@app.command("import")
def import_(
    sources: list[Path] = typer.Argument(..., metavar="SRC", help=SOURCES_HELP),
    out: Path = typer.Option(..., help="The ensdiag model file to write (.safetensors)."),
    family: str = FAMILY,
    arch: str = ARCH,
    num_classes: int = NUM_CLASSES,
):
    """Convert an ensemble trained elsewhere to an ensdiag model file.

    Once, with its source recorded; ensdiag model files are copied as they are."""
    check_inputs("SRC", sources, folders=True)
    from ..checkpoint import save_model
    from ..foreign.checkpoints import open_ensemble

    model = open_ensemble(sources, family, raw_ok=False, arch=arch, num_classes=num_classes)  # ensdiag's own files too
    target = output_file(out, "model.safetensors")
    source = json.dumps({"files": [path.name for path in sources], "from": family, "arch": arch}, sort_keys=True)
    save_model(model, target, {"ensdiag.source": source})
    note(f"{', '.join(map(str, sources))}: {model.spec.arch}, {model.method}, k = {model.num_members}")
    print(terminal(target))
