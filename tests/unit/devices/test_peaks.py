"""The dense-peak table: NVML's names find the right GPU, dense figures (never the sparse ones), MFU null
where no peak is known."""

from __future__ import annotations

import pytest

from autofit.devices import mfu, peak_flops_for

T = 1e12


@pytest.mark.parametrize(("nvml_name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
])
def test_nvml_names_find_their_model(nvml_name, model):
    assert peak_flops_for(nvml_name).model == model


def test_peaks_are_dense_not_sparse():
    h100 = peak_flops_for("NVIDIA H100 80GB HBM3")
    assert h100.flops_per_s("bf16") == pytest.approx(989.4 * T)  # the datasheet's 1,979 is with sparsity
    assert h100.flops_per_s("fp16") == h100.flops_per_s("bf16")
    assert h100.flops_per_s("tf32") == pytest.approx(494.7 * T)
    assert h100.flops_per_s("fp32") == pytest.approx(67 * T)
    assert peak_flops_for("NVIDIA A100-SXM4-40GB").flops_per_s("bf16") == pytest.approx(312 * T)


def test_mfu_against_the_dense_peak_and_null_where_unknown():
    assert mfu(350e12, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(350 / 989.4)
    assert mfu(1e12, "cpu", "bf16") is None
    assert mfu(1e12, "AMD Instinct MI300X", "bf16") is None
    assert mfu(None, "NVIDIA H100 80GB HBM3", "bf16") is None


@pytest.mark.parametrize("nvml_name", [
    "NVIDIA RTX A1000",  # "a100" and "a10" are fragments of its name, not its model
    "NVIDIA RTX A1000 6GB Laptop GPU",
    "NVIDIA GH200 480GB",  # not the H200
    "NVIDIA GeForce RTX 4090 D",  # fewer SMs than the 4090
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA H100L",
    "NVIDIA L40G",
    "Tesla V100-SXM2-16GB",
])
def test_a_model_is_matched_by_whole_words_never_by_a_fragment(nvml_name):
    assert peak_flops_for(nvml_name) is None


def test_a_mig_slice_has_no_peak_from_its_name_alone_and_its_share_of_sms_with_them():
    """The profile's "1g" counts compute slices, not SMs (seven 1g slices hold 98 of an A100's 108):
    without the slice's SM count there is no honest peak, with it the GPU's is scaled."""
    name = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert peak_flops_for(name) is None
    assert mfu(1e12, name, "bf16") is None
    slice_ = peak_flops_for(name, multiprocessors=14)
    assert slice_.flops_per_s("bf16") == pytest.approx(312 * T * 14 / 108)
    assert "14 of 108 SMs" in slice_.model
    assert peak_flops_for("NVIDIA H100 80GB HBM3 MIG 7g.80gb", multiprocessors=132).flops_per_s("bf16") == \
        pytest.approx(989.4 * T)
    assert peak_flops_for("NVIDIA L4", multiprocessors=10).flops_per_s("bf16") == pytest.approx(121 * T)  # no MIG: whole
