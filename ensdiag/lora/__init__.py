"""LoRA ensembles: k PEFT adapters of one frozen base, compared in weight space without forming
any ΔW = s·B·A (docs/conventions.md, "LoRA ensembles").

- `config.py`: the adapter folders and their configs, checked alike (torch-free);
- `adapters.py`: the factors A, B, read one module at a time and checked like user input;
- `base.py`: the base model's weights, streamed in blocks of rows from safetensors shards;
- `maths.py`: the factored identities (pure functions);
- `analysis.py`: the `lora` section of metrics.json, saved as a run;
- `harness.py`: lm-eval run on each adapter (`ensdiag evaluate ADAPTER_DIR…`).
The CLI's side is cli/lora.py; the terminal's tables, report/lora_terminal.py.

    from ensdiag.lora.config import read_adapter_folders
    from ensdiag.lora.analysis import diagnose_adapters
    section = diagnose_adapters(read_adapter_folders(["a", "b", "c"]), base="base-model/")
"""

from .config import adapter_folders

__all__ = ["adapter_folders"]
