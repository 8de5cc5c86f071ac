"""A device's share of its physical GPU, from MIG profile names and AMD compute partitions (worked by hand)."""

from __future__ import annotations

import pytest

from otel_ofu.gpu_share import DEFAULT_MIG_SLICES, assumed_slices, gpu_share, mig_slices, peak_share

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("profile", "slices"),
    [
        ("1g.10gb", 1),
        ("1g.10gb+me", 1),  # media extensions: still one compute slice
        ("2g.20gb", 2),
        ("3g.40gb", 3),
        ("7g.80gb", 7),
        ("MIG 4g.40gb", 4),  # as NVML's device name ends
        ("1c.3g.40gb", 1),  # a compute instance of one slice inside a 3g GPU instance
        ("2c.4g.20gb", 2),
        ("bogus", None),
        ("0g.5gb", None),
    ],
)
def test_mig_slices_from_the_profile_name(profile: str, slices: int | None) -> None:
    assert mig_slices(profile) == slices


def test_an_h100_in_seven_1g_slices_is_one_gpu() -> None:
    # The MIG guide: an H100 has 7 compute slices, a 1g profile holds 1 of them.
    assert gpu_share(H100, "1g.10gb") == pytest.approx(1 / 7)
    assert sum(gpu_share(H100, "1g.10gb") for _ in range(7)) == pytest.approx(1.0)
    # 3g + 2g + 1g + 1g = 7 slices: the whole GPU again.
    shares = [gpu_share(H100, p) for p in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")]
    assert sum(shares) == pytest.approx(1.0)
    assert gpu_share(A100, "7g.80gb") == 1.0


def test_an_a30_has_four_slices() -> None:
    # The MIG guide's A30 row: 4 compute slices; a 1g.6gb is 1/4 of it, a 2g.12gb 1/2.
    assert gpu_share("NVIDIA A30", "1g.6gb") == 0.25
    assert gpu_share("NVIDIA A30", "2g.12gb") == 0.5
    assert not assumed_slices("NVIDIA A30", "1g.6gb")


def test_a_partitioned_model_the_catalog_lacks_counts_seven_slices_and_says_so() -> None:
    assert gpu_share("NVIDIA Future GPU", "1g.12gb") == pytest.approx(1 / DEFAULT_MIG_SLICES)
    assert assumed_slices("NVIDIA Future GPU", "1g.12gb")


def test_whole_gpus_and_unreadable_profiles_count_one() -> None:
    assert gpu_share(H100) == 1.0
    assert gpu_share(None) == 1.0
    assert gpu_share(H100, "") == 1.0
    assert gpu_share(H100, "bogus") == 1.0
    assert assumed_slices(H100, "bogus")
    assert not assumed_slices(H100, "1g.10gb")
    assert not assumed_slices(H100)


def test_amd_compute_partitions() -> None:
    model = "AMD Instinct MI300X OAM"
    assert gpu_share(model, compute_partition="spx") == 1.0
    assert gpu_share(model, compute_partition="DPX") == 0.5
    assert gpu_share(model, compute_partition="qpx") == 0.25
    assert gpu_share(model, compute_partition="tpx") == pytest.approx(1 / 3)
    assert not assumed_slices(model, compute_partition="qpx")


# --- the peak share: SMs, not compute slices ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "profile", "share"),
    [
        # NVIDIA DCGM user guide (MIG example, `nvidia-smi mig -lgip` on an A100 40GB): 1g.5gb 14, 2g.10gb 28,
        # 3g.20gb 42, 4g.20gb 56, 7g.40gb 98 of the A100's 108 SMs.
        ("NVIDIA A100-SXM4-40GB", "1g.5gb", 14 / 108),
        ("NVIDIA A100-SXM4-40GB", "3g.20gb", 42 / 108),
        ("NVIDIA A100-SXM4-40GB", "7g.40gb", 98 / 108),
        ("NVIDIA A100-SXM4-80GB", "3g.40gb", 42 / 108),  # the 80GB board's names for the same slices
        ("NVIDIA A100 80GB PCIe", "2g.20gb", 28 / 108),
        # H100 80GB (`nvidia-smi mig -lgip`): 1g.10gb 16, 1g.20gb 26 (one compute slice, more SMs), 2g.20gb 32,
        # 3g.40gb 60, 4g.40gb 64, 7g.80gb 132 of 132.
        (H100, "1g.10gb", 16 / 132),
        (H100, "1g.10gb+me", 16 / 132),  # media extensions add decoders, not SMs
        (H100, "1g.20gb", 26 / 132),
        (H100, "3g.40gb", 60 / 132),
        (H100, "MIG 7g.80gb", 1.0),
        # A30: the MIG guide's "Fraction of SMs" column, 1/4, 2/4 and 4/4 (full) of its 56 SMs.
        ("NVIDIA A30", "1g.6gb", 0.25),
        ("NVIDIA A30", "2g.12gb", 0.5),
    ],
)
def test_a_mig_slices_peak_share_is_its_sms_share(model: str, profile: str, share: float) -> None:
    assert peak_share(model, profile) == pytest.approx(share)


def test_billing_shares_stay_compute_slices() -> None:
    # What schedulers allocate and the bill counts: a 3g.20gb is 3/7 of an A100, though it holds 42/108 of its SMs.
    assert gpu_share("NVIDIA A100-SXM4-40GB", "3g.20gb") == pytest.approx(3 / 7)
    assert gpu_share(H100, "1g.20gb") == pytest.approx(1 / 7)


def test_a_peak_share_no_source_gives_is_unknown_not_guessed() -> None:
    assert peak_share(H100, "1c.3g.40gb") is None  # a compute instance's SMs: in no table here
    assert peak_share("NVIDIA B200", "1g.23gb") is None  # no B200 profile table here
    assert peak_share("NVIDIA Future GPU", "1g.12gb") is None
    assert peak_share(H100, "bogus") is None
    assert peak_share(H100) == 1.0  # a whole GPU
    # AMD compute partitions split the XCDs evenly (38 CUs each on an MI300X): the peak share is the partition's.
    assert peak_share("AMD Instinct MI300X OAM", compute_partition="cpx") == pytest.approx(1 / 8)
    assert peak_share("AMD Instinct MI300X OAM", compute_partition="dpx") == pytest.approx(1 / 2)
