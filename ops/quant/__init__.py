"""Quantization ops (OSTQuant, ICLR 2025): fake quantization, RTN, GPTQ, orthogonal transforms, QSUR, KL-Top."""

from __future__ import annotations

from ops.quant.fake import (
    Quantizer,
    check_bits,
    check_group,
    clip_ratios,
    fake_quant,
    round_ste,
    rtn_weight,
    symmetric_scale,
)
from ops.quant.gptq import gptq, gptq_naive, input_hessian
from ops.quant.losses import kl_full, kl_top
from ops.quant.qsur import log_qsur, qsur, qsur_of_samples
from ops.quant.transforms import (
    CayleySGD,
    cayley_retraction,
    hadamard,
    klt,
    random_hadamard,
    random_orthogonal,
    row_covariance,
    weight_klt,
)

__all__ = [
    "CayleySGD",
    "Quantizer",
    "cayley_retraction",
    "check_bits",
    "check_group",
    "clip_ratios",
    "fake_quant",
    "gptq",
    "gptq_naive",
    "hadamard",
    "input_hessian",
    "kl_full",
    "kl_top",
    "klt",
    "log_qsur",
    "qsur",
    "qsur_of_samples",
    "random_hadamard",
    "random_orthogonal",
    "round_ste",
    "row_covariance",
    "rtn_weight",
    "symmetric_scale",
    "weight_klt",
]
