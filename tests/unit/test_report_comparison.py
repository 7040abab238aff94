"""comparison_sentence: the NIC variants that spent the least and the most CPU in their driver."""

from __future__ import annotations

from typing import Any

from labctl.report.throughput import comparison_sentence


def step(variant: str | None, cpu: float | None, mbit: float | None = None, status: str = "ok",
         model: str | None = None) -> dict[str, Any]:
    return {"name": "transfer", "variant": variant, "status": status,
            "nic": {"guest": "a", "model": model or variant} if (model or variant) else None,
            "figures": {"driver_cpu_pct": cpu, "throughput_mbit_s": mbit}}


def test_the_example_sentence() -> None:
    steps = [step("rtl8139", 4.9, 312.0), step("e1000", 2.2, 400.0), step("virtio-net-pci", 0.4, 488.0)]
    assert comparison_sentence(steps) == ("virtio-net-pci used 12.2 times less CPU in its driver than rtl8139 "
                                          "(0.4% vs 4.9% of the CPU), at 61 vs 39 MB/s.")


def test_fixture_numbers_keep_two_decimals() -> None:
    steps = [step("rtl8139", 17.53, 312.5), step("virtio-net-pci", 1.42, 488.0)]
    assert comparison_sentence(steps) == ("virtio-net-pci used 12.3 times less CPU in its driver than rtl8139 "
                                          "(1.42% vs 17.53% of the CPU), at 61 vs 39 MB/s.")


def test_without_throughput_there_is_no_speed_clause() -> None:
    assert comparison_sentence([step("e1000", 2.0), step("virtio", 1.0, 80.0)]) == (
        "virtio used 2.0 times less CPU in its driver than e1000 (1.0% vs 2.0% of the CPU).")


def test_slow_links_get_a_decimal() -> None:
    sentence = comparison_sentence([step("ne2k_pci", 30.0, 9.6), step("e1000", 3.0, 72.0)])
    assert sentence is not None and sentence.endswith("at 9.0 vs 1.2 MB/s.")


def test_zero_cpu_does_not_divide() -> None:
    assert comparison_sentence([step("rtl8139", 4.9, 312.0), step("virtio-net-pci", 0.0, 488.0)]) == (
        "virtio-net-pci used no measurable CPU in its driver, rtl8139 used 4.9% of the CPU in its driver, "
        "at 61 vs 39 MB/s.")


def test_equal_cpu() -> None:
    assert comparison_sentence([step("e1000", 2.0), step("e1000e", 2.02)]) == (
        "e1000 used about as much CPU in its driver as e1000e (2.0% vs 2.02% of the CPU).")


def test_nothing_to_compare() -> None:
    assert comparison_sentence([]) is None
    assert comparison_sentence([step("rtl8139", 4.9)]) is None
    assert comparison_sentence([step("rtl8139", 4.9), step("e1000", None)]) is None
    assert comparison_sentence([step("rtl8139", 4.9), step("e1000", 1.0, status="failed")]) is None
    assert comparison_sentence([step(None, 4.9), step(None, 1.0)]) is None
    assert comparison_sentence([step("rtl8139", 4.9), step("rtl8139", 1.0)]) is None  # one variant twice


def test_variant_falls_back_to_the_nic_model_and_bad_values_are_ignored() -> None:
    steps = [step(None, 3.0, model="pcnet"), step("virtio", 1.5), step("e1000", "high"),  # type: ignore[arg-type]
             step("ne2k_pci", True)]
    assert comparison_sentence(steps) == (
        "virtio used 2.0 times less CPU in its driver than pcnet (1.5% vs 3.0% of the CPU).")


def costed(variant: str, host: float | None, guest: float | None, cpu: float = 1.0,
           status: str = "ok") -> dict[str, Any]:
    s = step(variant, cpu, 100.0, status)
    s["figures"].update(host_cpu_s_per_gb=host, guest_cpu_s_per_gb=guest)
    return s


def test_under_tcg_the_headline_is_the_whole_cost_and_says_where_the_device_model_runs() -> None:
    # the guest's view says rtl8139's driver is cheapest; the whole cost says otherwise
    steps = [costed("rtl8139", 157.5, 123.6, cpu=0.5), costed("e1000", 114.6, 88.4, cpu=5.9),
             costed("virtio-net-pci", 124.4, 92.0, cpu=1.3)]
    sentence = comparison_sentence(steps, "tcg")
    assert sentence == (
        "Counting every QEMU's host CPU time (guest code, device models and I/O), e1000 cost 115 host CPU s "
        "per GB moved and rtl8139 158 (1.4 times as much) (one run each: repeat: N on the step tells this from "
        "noise); inside the guests 88.4 vs 124 CPU s/GB. "
        "Under TCG the emulated NICs' device models run inside QEMU on the host, out of the guest profiler's "
        "sight: the guest driver's share is not the NIC's cost.")
    assert "in its driver" not in sentence  # the guest's driver share is no headline under TCG


def test_under_tcg_without_host_figures_nothing_is_ranked() -> None:
    steps = [costed("rtl8139", None, None, cpu=0.5), costed("e1000", None, None, cpu=5.9)]
    sentence = comparison_sentence(steps, "tcg")
    assert sentence is not None and "cannot rank" in sentence and "times less" not in sentence


def test_under_kvm_the_seed_sentence_leads_and_the_whole_cost_follows() -> None:
    steps = [costed("rtl8139", 20.0, 9.0, cpu=3.0), costed("virtio-net-pci", 5.0, 2.0, cpu=0.25)]
    sentence = comparison_sentence(steps, "kvm")
    assert sentence is not None
    assert sentence.startswith("virtio-net-pci used 12.0 times less CPU in its driver than rtl8139")
    assert "virtio-net-pci cost 5.00 host CPU s per GB moved and rtl8139 20.0 (4.0 times as much)" in sentence


def test_the_whole_cost_of_repeated_runs_is_their_mean_and_failed_runs_do_not_count() -> None:
    steps = [costed("rtl8139", 100.0, 50.0), costed("rtl8139", 120.0, 70.0), costed("virtio", 10.0, 5.0),
             costed("virtio", 12.0, 5.0), costed("virtio", 1.0, 1.0, status="failed")]
    sentence = comparison_sentence(steps, "tcg")
    assert sentence is not None
    assert ("virtio cost 11.0 host CPU s per GB moved and rtl8139 110 (10.0 times as much), beyond the run-to-run "
            "noise of their 2 and 2 runs; inside the guests 5.00 vs 60.0 CPU s/GB.") in sentence


def test_a_ranking_within_the_noise_is_said_to_be_one() -> None:
    steps = [costed("rtl8139", 100.0, 50.0), costed("rtl8139", 160.0, 70.0), costed("virtio", 150.0, 5.0),
             costed("virtio", 190.0, 5.0)]
    sentence = comparison_sentence(steps, "tcg")
    assert sentence is not None and "but that is within the run-to-run noise of their 2 and 2 runs" in sentence


def test_costs_within_ten_percent_are_about_the_same() -> None:
    sentence = comparison_sentence([costed("rtl8139", 145.0, 112.0), costed("virtio", 155.0, 122.0)], "tcg")
    assert sentence is not None and "the NIC models cost about the same host CPU per GB moved" in sentence
    assert "times as much" not in sentence
