"""The dense-peak table: NVML's names find the right GPU, dense figures (never the sparse ones), MFU null
where no peak is known."""

from __future__ import annotations

import pytest

from autofit.devices import mfu, peak_for

T = 1e12


@pytest.mark.parametrize(("nvml_name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
])
def test_nvml_names_find_their_model(nvml_name, model):
    assert peak_for(nvml_name).model == model


def test_peaks_are_dense_not_sparse():
    h100 = peak_for("NVIDIA H100 80GB HBM3")
    assert h100.flops_per_s("bf16") == pytest.approx(989.4 * T)  # the datasheet's 1,979 is with sparsity
    assert h100.flops_per_s("fp16") == h100.flops_per_s("bf16")
    assert h100.flops_per_s("tf32") == pytest.approx(494.7 * T)
    assert h100.flops_per_s("fp32") == pytest.approx(67 * T)
    assert peak_for("NVIDIA A100-SXM4-40GB").flops_per_s("bf16") == pytest.approx(312 * T)


def test_mfu_against_the_dense_peak_and_null_where_unknown():
    assert mfu(350e12, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(350 / 989.4)
    assert mfu(1e12, "cpu", "bf16") is None
    assert mfu(1e12, "AMD Instinct MI300X", "bf16") is None
    assert mfu(None, "NVIDIA H100 80GB HBM3", "bf16") is None
