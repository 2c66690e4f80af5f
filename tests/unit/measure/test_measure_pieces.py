"""The pieces of frenzy measure, each against a property that a wrong implementation would break:
the built torch models have exactly MARP's parameter counts, the live-bytes tracker counts
storages as CUDA's allocator does (512-B blocks, views shared, frees tracked) and agrees with
torch's MemTracker, the autocast emulation caches weight casts per region only, and bad inputs
are rejected before any work."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import marp  # noqa: E402
from frenzy.measure import compare, oracle  # noqa: E402
from frenzy.measure.models import build_model  # noqa: E402
from frenzy.measure.precision import Policy  # noqa: E402
from frenzy.measure.step import MeasureConfig, measure  # noqa: E402
from frenzy.measure.tracker import LiveBytes, rounded  # noqa: E402

SPECS = {
    "gpt2-tied": oracle.gpt2(),
    "gpt2-untied": oracle.gpt2(3, 128, 2, vocab=1000, tied=False),
    "llama-mha": oracle.llama(),
    "llama-gqa-tied": oracle.llama(2, 512, 8, 2, 1376, vocab=8000, tied=True),
    "qwen2-qkv-bias": marp.model_from_hf_config({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 256, "intermediate_size": 704,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2048,
        "max_position_embeddings": 1024, "tie_word_embeddings": False}),
    "bert-mlm": oracle.bert(),
    "bert-mlm-untied": marp.ModelSpec(**{**oracle.bert().to_dict(), "tied_embeddings": False}),
    "bert-classifier": oracle.bert(2, 128, 2, head="classifier"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("precision", ["fp32", "pure-bf16"])
def test_built_model_has_marps_parameter_count(name: str, precision: str) -> None:
    spec = SPECS[name]
    with FakeTensorMode():
        model = build_model(spec, Policy(precision))
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == spec.param_count()
    dtype = torch.bfloat16 if precision == "pure-bf16" else torch.float32
    assert {p.dtype for p in params} == {dtype}


def test_bf16_policy_lives_in_bf16_and_amp_keeps_fp32_parameters() -> None:
    assert Policy("pure-bf16").param_dtype == torch.bfloat16
    assert Policy("amp-bf16").param_dtype == torch.float32
    with pytest.raises(ValueError):
        Policy("fp16")


def test_rounding_to_cuda_blocks() -> None:
    assert [rounded(n, 512) for n in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]
    assert rounded(513, 1) == 513


def test_tracker_counts_storages_once_rounds_and_releases() -> None:
    with FakeTensorMode():
        tr = LiveBytes(512)
        with tr:
            a = torch.empty(1000, dtype=torch.float32)  # 4000 B -> 4096
            view = a[10:20]  # a view: same storage, nothing new
            b = a * 2  # 4096 more
            assert tr.current == 8192 and tr.bytes_of(view) == 4096
            del b
            assert tr.current == 4096  # the weak reference released it
            c = torch.empty(3, dtype=torch.uint8)  # 3 B -> one 512-B block
            assert tr.current == 4096 + 512
        assert tr.peak == 8192
        del a, view, c


def test_tracker_counts_storage_resizes_as_fsdp2_frees_and_regathers() -> None:
    # FSDP2 frees a gathered layer with untyped_storage().resize_(0) and re-allocates it with
    # resize_(nbytes) before the next all-gather (torch's _fsdp_param.free_storage /
    # alloc_storage); the tensor object lives on, so only the resize says the memory went.
    from torch.distributed.fsdp._fully_shard._fsdp_param import alloc_storage, free_storage

    with FakeTensorMode():
        tr = LiveBytes(512)
        with tr, tr.counting_resizes():
            gathered = torch.empty(1000, dtype=torch.bfloat16)  # 2000 B -> 2048
            other = torch.empty(100, dtype=torch.float32)  # 400 B -> 512
            assert tr.current == 2048 + 512
            free_storage(gathered)
            assert tr.current == 512 and tr.bytes_of(gathered) == 0  # stops counting
            gathered.untyped_storage().resize_(0)  # already empty: nothing changes
            assert tr.current == 512
            alloc_storage(gathered)  # resized up before the all-gather writes into it
            assert tr.current == 2048 + 512 and tr.bytes_of(gathered) == 2048
            free_storage(gathered)
            del other
            assert tr.current == 0
        assert tr.peak == 2048 + 512
        del gathered
        assert tr.current == 0  # the emptied storage's death subtracts nothing more
    # Outside counting_resizes the storage method is torch's own again.
    assert "resize_" not in torch.UntypedStorage.__dict__


def test_tracker_breakdown_is_taken_at_the_peak() -> None:
    seen = []

    def classify(tr: LiveBytes) -> dict[str, int]:
        seen.append(tr.current)
        return {"total": tr.current}

    with FakeTensorMode():
        tr = LiveBytes(1, classify)
        with tr:
            x = torch.empty(100)
            y = torch.empty(300)
            del x, y
            z = torch.empty(50)
        assert tr.peak == 1600 and tr.peak_breakdown == {"total": 1600}
        assert seen == [400, 1600]  # called only at new maxima
        del z


def test_tracker_agrees_with_torch_memtracker_without_rounding() -> None:
    # Same counting rule as torch.distributed._tools.mem_tracker.MemTracker (one entry per untyped
    # storage, freed through a weak reference): the peaks of a forward + backward must be equal.
    from torch.distributed._tools.mem_tracker import MemTracker

    spec = oracle.gpt2(2, 128, 2, vocab=512)

    def run(counter: str) -> int:
        with FakeTensorMode():
            model = build_model(spec, Policy("fp32"), "eager")
            ids = torch.randint(0, spec.vocab, (2, 64))
            if counter == "ours":
                tr = LiveBytes(1)
                tr.track([*model.parameters(), ids])
                with tr:
                    model(ids).float().logsumexp(-1).mean().backward()
                return tr.peak
            mt = MemTracker()
            mt.track_external(model, ids)
            with mt:
                model(ids).float().logsumexp(-1).mean().backward()
            snap = mt.get_tracker_snapshot("peak")
            return max(d["Total"] for d in snap.values())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MemTracker's get_untyped_storages warnings (memory-notes pitfall 9)
        assert run("ours") == run("memtracker")


def test_autocast_weight_cache_lives_for_one_region() -> None:
    with FakeTensorMode():
        p = Policy("amp-bf16")
        w = torch.nn.Parameter(torch.empty(4, 4))
        act = torch.empty(4, 4)
        with p.region():
            first, again = p.low(w), p.low(w)
            assert first is again and first.dtype == torch.bfloat16  # cached: cast once per region
            assert p.low(act) is not p.low(act)  # activations are cast anew at every use
            with p.region():  # nested regions share the outermost cache
                assert p.low(w) is first
        with p.region():
            assert p.low(w) is not first  # a new region casts again
        assert p.f32(first).dtype == torch.float32
        pure = Policy("pure-bf16")
        assert pure.low(w) is w and pure.f32(first) is first


@pytest.mark.parametrize(("kw", "word"), [
    ({"seq_len": 0}, "seq_len"), ({"micro_batch": True}, "micro_batch"), ({"precision": "fp16"}, "precision"),
    ({"optimizer": "adam8bit"}, "optimizer"), ({"attention": "sdpa"}, "attention"),
    ({"recompute": "selective"}, "recompute"), ({"gqa": "mqa"}, "gqa"), ({"dropout": 1.0}, "dropout"),
    ({"grad_buffer": "kept"}, "grad_buffer"), ({"optimizer_impl": "fused"}, "optimizer_impl"),
])  # fmt: skip
def test_measure_config_rejects_bad_values(kw: dict, word: str) -> None:
    base = {"seq_len": 16, "micro_batch": 1}
    with pytest.raises(ValueError, match=word):
        MeasureConfig(**{**base, **kw})


def test_measure_rejects_sequences_past_learned_positions() -> None:
    with pytest.raises(ValueError, match="learned positions"):
        measure(oracle.bert(), MeasureConfig(seq_len=1024, micro_batch=1))


def test_marp_is_asked_about_the_measured_step() -> None:
    assert compare.PRECISIONS["bf16"] == "pure-bf16"  # frenzy measure's bf16 is pure bf16
    recipe, layout = compare.marp_inputs(MeasureConfig(128, 2, "pure-bf16", "sgd", "eager", "full", "native", 0.1,
                                                       "persistent"))  # fmt: skip
    assert recipe.policy == "pure-bf16" and recipe.optimizer == "sgd" and not recipe.flash_attention
    assert (recipe.dropout, recipe.resolved_grad_buffer, recipe.resolved_kv_repeat) == (0.1, "persistent", False)
    assert (recipe.resolved_loss, recipe.fused_kernels, recipe.resolved_optimizer_impl) == ("torch", False, "foreach")
    assert (layout.num_gpus, layout.micro_batch, layout.grad_accum, layout.recompute) == (1, 2, 1, "full")


def test_importing_the_cli_does_not_import_torch() -> None:
    code = "import sys, frenzy.cli.main, frenzy.measure; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
