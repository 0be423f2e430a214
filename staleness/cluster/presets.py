"""GPU presets: relative training throughput of common GPUs.

``PRESETS[name]`` is a GPU's throughput relative to the GTX 1080 Ti (= 1.0);
:func:`staleness.cluster.gpus` turns it into seconds per iteration
(``seconds / PRESETS[name]``). Sources and caveats are in the comments below.
"""

from __future__ import annotations

__all__ = ["PRESETS"]

# Relative *training throughput* (images/s on ResNet-50 at the framework's
# default single-GPU precision), normalized to the GTX 1080 Ti = 1.0. A GPU
# with preset r takes seconds / r per iteration. These are approximate: ratios
# between GPUs depend on the model, batch size, precision and software
# version (+-20 % is typical between published benchmark rounds).
#
# Source A: Lambda Labs, "deeplearning-benchmark" repository
#   (github.com/lambdal/deeplearning-benchmark), file
#   pytorch/pytorch-train-throughput-fp32.csv at commit e167f02c (its
#   2020-2021 rounds: NVIDIA DeepLearningExamples ResNet-50 in NGC PyTorch
#   20.x-era containers, one GPU, column `resnet50`, images/s; the GTX 1080 Ti
#   raw log in pytorch/results/1080Ti shows ImageNet, batch 100, 196 img/s).
#   On Ampere GPUs "fp32" runs use TF32 tensor cores (PyTorch's default for
#   convolutions), so the A100 / RTX 30xx ratios are default-precision ones.
_LAMBDA_PT_2020 = {
    "gtx1080ti": 196.0,  # "GTX 1080Ti"
    "rtx2080ti": 275.0,  # "RTX 2080Ti"
    "v100": 368.0,  # "V100 32GB"
    "rtx3080": 384.0,  # "RTX 3080"
    "rtx3090": 471.0,  # "RTX 3090"
    "a100": 798.0,  # "A100 40GB SXM4"
}
# Source B: the same file in its 2023-2024 rounds (e.g. at commit 0551cb70;
#   NGC PyTorch 22.09 and later), which has no GTX 1080 Ti row. Used only for
#   GPUs missing from source A, bridged through the closest GPU present in both
#   rounds (H100 via A100, RTX 4090 via RTX 3090): between rounds the V100
#   stayed at 368-369 img/s but the A100 went from 798 (40GB) to 1066 (80GB),
#   so a bridge through the V100 would credit the newer software to the newer
#   GPUs.
_LAMBDA_PT_2023 = {
    "v100": 369.0,  # "LambdaCloud V100 16GB"
    "rtx3090": 513.0,  # "RTX 3090"
    "a100": 1066.0,  # "A100 80GB SXM4"
    "rtx4090": 721.0,  # "RTX 4090"
    "h100": 1753.0,  # "H100 80GB SXM5"
}
# Cross-check (not used): Lambda's 2019 TensorFlow blog post "Deep Learning GPU
#   Benchmarks - V100 vs 2080 Ti vs 1080 Ti vs Titan V", ResNet-50 FP32 img/s:
#   1080 Ti 209, 2080 Ti 294, V100 405 -> 1.41 and 1.94, within 4 % of source A.
# No preset for GPUs without a row in these sources (e.g. T4, P100).


def _rel(name: str) -> float:
    return _LAMBDA_PT_2020[name] / _LAMBDA_PT_2020["gtx1080ti"]


PRESETS: dict[str, float] = {
    # DSSP paper (Zhao et al., ICDCS 2019): GTX 1060 vs GTX 1080 Ti
    # "throughput ratio about 1:2.6".
    "gtx1060": 1.0 / 2.6,
    "gtx1080ti": 1.0,  # reference
    "rtx2080ti": _rel("rtx2080ti"),  # 275 / 196 = 1.40
    "v100": _rel("v100"),  # 368 / 196 = 1.88
    "rtx3080": _rel("rtx3080"),  # 384 / 196 = 1.96
    "rtx3090": _rel("rtx3090"),  # 471 / 196 = 2.40
    "a100": _rel("a100"),  # 798 / 196 = 4.07
    # 2.40 * 721 / 513 = 3.38
    "rtx4090": _rel("rtx3090") * _LAMBDA_PT_2023["rtx4090"] / _LAMBDA_PT_2023["rtx3090"],
    # 4.07 * 1753 / 1066 = 6.69
    "h100": _rel("a100") * _LAMBDA_PT_2023["h100"] / _LAMBDA_PT_2023["a100"],
}

