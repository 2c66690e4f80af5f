"""The refusal of a job with no plan (scheduler.no_plan) says what to change: another --gpu-type when
the cluster has none of the asked type, --precision fp16 on GPUs without bf16, memory otherwise."""

from __future__ import annotations

from frenzy.scheduler.no_plan import fp16_instead, no_plan_reason

A100_L4 = [("A100-80GB", 4), ("L4", 2)]


def test_a_gpu_type_the_cluster_does_not_have_is_named_with_the_types_it_has() -> None:
    text = no_plan_reason("gpt2-355m", "bf16", A100_L4, ["h100"], [])
    assert text == ("spec: no node has H100-80GB (--gpu-type, limits.allowed_gpu_types); the cluster has "
                    "4 x A100-80GB, 2 x L4. To fix: submit with --gpu-type A100-80GB or --gpu-type L4, or without "
                    "--gpu-type")
    assert "micro_batch" not in text


def test_without_live_nodes_the_catalogs_answer_counts() -> None:
    # No nodes: the predictor planned the asked types from the catalog; what it rejected is the reason.
    text = no_plan_reason("llama-2-70b", "bf16", [], ["L4"], ["L4: needs at least 90 GiB per GPU"])
    assert text.startswith("spec: no GPU type in the cluster can hold llama-2-70b") and "no live nodes" in text
    assert "L4: needs at least 90 GiB per GPU" in text and "no node has" not in text
    assert no_plan_reason("gpt2-124m", "bf16", [], ["T4"], ["T4: no bf16 support"]).startswith(
        "spec: T4 cannot run bf16")


def test_t4_or_v100_with_bf16_suggests_fp16_not_a_smaller_micro_batch() -> None:
    rejected = ["T4: no bf16 support (use an fp16 or fp32 precision policy)"]
    text = no_plan_reason("gpt2-124m", "bf16", [("T4", 4)], [], rejected)
    assert text.startswith("spec: T4 cannot run bf16") and "To fix: submit with --precision fp16" in text
    assert "micro_batch" not in text
    # Asked for V100 on a mixed cluster: only the V100s count.
    text = no_plan_reason("gpt2-124m", "amp-bf16", [("V100-32GB", 8), ("A100-80GB", 1)], ["V100-32GB"], [])
    assert text.startswith("spec: V100-32GB cannot run amp-bf16") and "--precision amp-fp16" in text
    # Some types lack bf16 and the others are too small: both fixes, the precision one first.
    text = no_plan_reason("llama-2-70b", "bf16", [("T4", 4), ("L4", 1)], [],
                          ["T4: no bf16 support", "L4: needs at least 90 GiB per GPU"])
    assert "To fix: submit with --precision fp16 to use T4 as well, or lower recipe.micro_batch" in text


def test_memory_is_the_fix_when_every_type_runs_the_precision() -> None:
    text = no_plan_reason("llama-2-70b", "bf16", A100_L4, ["L4"], ["L4: needs at least 90 GiB per GPU"])
    assert text == ("spec: no GPU type in the cluster can hold llama-2-70b with this recipe (cluster: 4 x A100-80GB, "
                    "2 x L4). L4: needs at least 90 GiB per GPU. To fix: lower recipe.micro_batch or recipe.seq_len, "
                    "allow recompute, or add larger GPUs")


def test_the_fp16_policy_that_replaces_a_bf16_one() -> None:
    assert [fp16_instead(p) for p in ("bf16", "amp-bf16", "pure-bf16", "fsdp-bf16")] == [
        "fp16", "amp-fp16", "fp16", "fp16"]
