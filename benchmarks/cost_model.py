"""Analytical cost model of one training epoch per method (ResNet-18 / CIFAR-10), predicted for an H100.

    python benchmarks/cost_model.py [--arch resnet18] [--out benchmarks/results/cost-model-resnet18-cifar10.json]

An estimate, not a measurement: nothing runs on a GPU ("kind": "estimate" in the JSON). The
`cifar10` preset gives 50,000 training images 3×32×32 (none held out), the batch size, k, the
optimiser and the method options. Models are built as experiment.py builds them, on the meta
device (shapes only: seconds on any CPU), and one small batch is counted, then scaled:
- FLOPs: `FlopCounterMode` on the forward of one training step shaped as `train_epoch` shapes it
  (the kit's data orders, `examples_per_batch`, `member_batch`, `model.forward_members`), so
  each method's real rows count: MC Dropout trains 1 pass per example, Deep Ensembles and
  BatchEnsemble k, Packed-Ensembles one wide grouped pass, MIMO r rows per example through one
  shared body. Matmuls and convolutions only (not BatchNorm, ReLU, rank-1 scalings). Backward = 2× forward.
- Bytes, a lower bound: per optimiser step the fp32 weights, gradients and optimiser state (SGD
  momentum 1 tensor, Adam 2) each read and written once; every leaf module's output (conv,
  BatchNorm, linear, dropout; not functional ReLUs or residual adds) written once in forward and
  read once in backward at bf16 (2 bytes). No cache effects, activation gradients or data gather.
- Time: max(FLOPs / (peak × FLOP fraction), bytes / (HBM bandwidth × bandwidth fraction)), H100
  SXM datasheet peaks (dense) and the fractions in ASSUMPTIONS; kernel-launch overhead is not modelled.
- Test-set inference (10,000 images in predict.py's batches of 1,000, forward only): weights read
  once per batch, activations written once and read once, at fp32 on CUDA cores (what ensdiag
  predicts in: exact fp32, TF32 off), and for comparison at TF32 (PyTorch's default for fp32
  convolutions on CUDA) and at bf16.
"""

import argparse
import json
import math
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import ensdiag
from ensdiag.config import preset_config
from ensdiag.nn.methods import members_for, run_label

ASSUMPTIONS = {
    "peak_tflops": {"bf16": 989.0, "tf32": 494.7, "fp32": 67.0},  # H100 SXM datasheet, dense
    "hbm_tb_per_s": 3.35,  # H100 SXM, HBM3
    "flop_fraction": 0.40,  # of peak at every precision: ResNet-18 at 32×32 runs many small kernels
    "bandwidth_fraction": 0.70,  # of peak HBM bandwidth for streaming kernels
    "backward_flops": "2 × forward (input gradient + weight gradient)",
    "counted_flops": "matmuls and convolutions only (FlopCounterMode); a multiply-add is 2 FLOPs",
    "training_precision": "bf16 autocast: activations 2 bytes; weights, gradients, optimiser state fp32 (4 bytes)",
    "bytes_per_step": "weights + gradients + optimiser state, each read once and written once",
    "activation_bytes": "leaf-module outputs written once (forward) and read once (backward / next layer)",
    "inference": "10,000 test images in batches of 1,000; weights read once per batch; forward only",
}
CIFAR10_TRAIN, TEST_IMAGES, EVAL_BATCH, SAMPLE = 50_000, 10_000, 1_000, 8  # SAMPLE: rows counted, then scaled
EXTRA_RUNS = ("packed-ensemble", "mimo")
DEVICE = torch.device("meta")


def sig(x, digits=4):
    """A number rounded to `digits` significant figures: what the JSON (and the docs' table) show."""
    return float(f"{x:.{digits}g}")


def count(model, step):
    """(forward FLOPs, leaf-module output elements) of one call of `step`."""
    elements = 0

    def hook(module, inputs, output):
        nonlocal elements
        if output is not inputs[0]:  # identity shortcuts and nn.Identity write nothing
            elements += output.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if next(m.children(), None) is None]
    with FlopCounterMode(display=False) as counter:
        step()
    for handle in handles:
        handle.remove()
    return counter.get_total_flops(), elements


def roofline(flops, nbytes, peak_tflops):
    """The predicted seconds, max(compute, memory), what bounds them, and both terms."""
    compute = flops / (peak_tflops * 1e12 * ASSUMPTIONS["flop_fraction"])
    memory = nbytes / (ASSUMPTIONS["hbm_tb_per_s"] * 1e12 * ASSUMPTIONS["bandwidth_fraction"])
    return {"seconds": sig(max(compute, memory)), "bound": "compute" if compute >= memory else "bandwidth",
            "compute_seconds": sig(compute), "memory_seconds": sig(memory), "gb_moved": sig(nbytes / 1e9)}


def estimate(config, run, train_images):
    method, options = config.model_options(run)
    k = members_for(method, config.members)
    with DEVICE:
        model = ensdiag.build_model(config.arch, method, k, config.num_classes, config.input_shape, **options)
    kit, params = model.kit, sum(p.numel() for p in model.parameters())
    # One training step, small: `orders` data orders × `b` distinct examples each, as train_epoch draws them.
    orders, b = kit.data_orders(), kit.examples_per_batch(SAMPLE)
    images = torch.zeros(orders, b, *config.input_shape, device=DEVICE)
    labels = torch.zeros(orders, b, dtype=torch.long, device=DEVICE)
    x, _ = kit.member_batch(images, labels, split_batch=config.be_split_batch, generator=None)
    model.train()
    flops, elements = count(model, lambda: model.forward_members(x))
    # An epoch shows every order all N images, b per step: the step's cost × N / b (all of it linear in rows).
    passes = kit.passes_per_example(config.be_split_batch)
    steps = math.ceil(train_images / kit.examples_per_batch(config.batch_size))
    state = {"sgd": 1 if config.momentum else 0, "adam": 2}[config.optimizer]
    epoch_flops = 3 * flops / b * train_images  # forward + backward (2× forward)
    epoch_bytes = steps * params * 4 * 2 * (2 + state) + elements / b * train_images * 2 * 2
    train = roofline(epoch_flops, epoch_bytes, ASSUMPTIONS["peak_tflops"]["bf16"])
    # Test-set inference: model(x), every member sees each image (MC Dropout: k masked passes).
    model.eval()
    with torch.no_grad():
        test_flops, test_elements = count(model, lambda: model(torch.zeros(SAMPLE, *config.input_shape, device=DEVICE)))
    test_flops *= TEST_IMAGES / SAMPLE
    weights = math.ceil(TEST_IMAGES / EVAL_BATCH) * params * 4
    inference = {}
    for precision, size in (("fp32", 4), ("tf32", 4), ("bf16", 2)):
        test_bytes = weights + test_elements / SAMPLE * TEST_IMAGES * size * 2
        inference[precision] = roofline(test_flops, test_bytes, ASSUMPTIONS["peak_tflops"][precision])
    return {"run": run, "label": run_label(run), "members": k, "options": model.spec.options, "parameters": params,
            "forward_gflops_per_image_per_member_pass": sig(flops / b / passes / 1e9),
            "member_passes_per_example": passes, "steps_per_epoch": steps,
            "epoch_tflops": sig(epoch_flops / 1e12), "epoch_gb_moved": sig(epoch_bytes / 1e9),
            "predicted_h100_seconds_per_epoch_bf16": train["seconds"], "training_bound": train["bound"],
            "training_roofline": train, "test_inference_tflops": sig(test_flops / 1e12),
            "predicted_h100_test_inference_seconds_fp32": inference["fp32"]["seconds"],
            "test_inference": inference}


def markdown(result):
    """The docs' table, every number as the JSON holds it (≈: an estimate; parameters are counted)."""
    rows = ["| method | parameters | forward GFLOP / image / member pass | member passes / example | "
            "epoch TFLOP | epoch GB moved | H100 s / epoch (bf16 training) | bound | "
            "test-set inference s (fp32 / TF32 / bf16) |", "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for m in result["methods"]:
        t = {p: f"≈ {r['seconds']}" + (" (bandwidth)" if r["bound"] == "bandwidth" else "")
             for p, r in m["test_inference"].items()}
        rows.append(f"| {m['label']} | {m['parameters']:,} | ≈ {m['forward_gflops_per_image_per_member_pass']} | "
                    f"{m['member_passes_per_example']} | ≈ {m['epoch_tflops']} | ≈ {m['epoch_gb_moved']} | "
                    f"≈ {m['predicted_h100_seconds_per_epoch_bf16']} | {m['training_bound']} | "
                    f"{t['fp32']} / {t['tf32']} / {t['bf16']} |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = preset_config("cifar10", arch=args.arch)
    train_images = round(CIFAR10_TRAIN * (1 - config.val_fraction))  # the preset trains on all of them
    runs = config.methods + tuple(run for run in EXTRA_RUNS if run not in config.methods)
    result = {"kind": "estimate", "device": "NVIDIA H100 SXM (predicted, not measured)",
              "preset": config.preset, "arch": config.arch, "train_images": train_images, "test_images": TEST_IMAGES,
              "input_shape": list(config.input_shape), "batch_size": config.batch_size, "members": config.members,
              "optimizer": config.optimizer, "assumptions": ASSUMPTIONS,
              "versions": {"torch": torch.__version__, "ensdiag": ensdiag.__version__},
              "methods": [estimate(config, run, train_images) for run in runs]}
    out = args.out or Path(f"benchmarks/results/cost-model-{config.arch}-{config.dataset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(markdown(result))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
