"""A diagnosis in TensorBoard (`pip install 'ensdiag[tensorboard]'`).

    from torch.utils.tensorboard import SummaryWriter
    diagnosis.log_to(SummaryWriter("tb/run-1"))          # or: log_diagnosis(diagnosis, "tb/run-1")

Scalars under their names (_records.py) at `step`, the heatmaps as an image, the summary line
and what was not measured as text. Any writer with TensorBoard's `add_scalar`, `add_image` and
`add_text` works (torch.utils.tensorboard's, tensorboardX's, a Lightning TensorBoardLogger's
`.experiment`).
"""

from ..errors import EnsdiagError, path_argument, public
from ..text import markdown
from ._records import Records, checked_step, diagnosis_records


def log(records: Records, writer, step: int | None = None) -> None:
    for name, value in records.scalars.items():
        writer.add_scalar(name, value, step)
    for name, image in records.images.items():
        writer.add_image(name, image, step, dataformats="HWC")
    for name, text in records.texts.items():
        writer.add_text(name, markdown(text, keep="\n").replace("\n", "  \n"), step)  # TensorBoard's text is Markdown
    writer.flush()


@public
def log_diagnosis(diagnosis, target, step: int | None = None, prefix: str = "ensdiag") -> None:
    """`target`: a SummaryWriter, or a folder for a new one (closed after; a file in its place refused)."""
    checked_step(step, prefix)
    records = diagnosis_records(diagnosis.metrics, prefix)
    if hasattr(target, "add_scalar"):
        log(records, target, step)
        return
    folder = path_argument(target, "target (a SummaryWriter or a folder)")
    if folder.exists() and not folder.is_dir():
        raise EnsdiagError(f"{folder} is a file: TensorBoard writes a folder of event files (give a folder or a SummaryWriter)")
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(folder))
    try:
        log(records, writer, step)
    finally:
        writer.close()
