"""Configuration validation, method families and dispatch order."""

from __future__ import annotations

import pytest

from ascend_specdecode.config_check import SpeculativeConfigError, validate_speculative_config
from ascend_specdecode.dispatch import SPECULATOR_CLASSES, select_speculator
from ascend_specdecode.methods import DISPATCH_ORDER, method_family


def test_valid_config_returns_family():
    spec = {"method": "eagle", "num_speculative_tokens": 3, "draft_vocab_size": 1000}
    assert validate_speculative_config(spec, target_vocab_size=1000) == "eagle"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"method": "telepathy", "num_speculative_tokens": 3}, "'telepathy' is unknown"),
        ({"method": "medusa", "num_speculative_tokens": 3}, "'medusa' is not a speculative method this plugin runs"),
        ({"method": "eagle", "num_speculative_tokens": 0}, "num_speculative_tokens must be a positive integer, got 0"),
        ({"method": "eagle", "num_speculative_tokens": -2}, "got -2"),
        ({"method": "eagle", "num_speculative_tokens": True}, "got True"),
        ({"method": "dflash", "num_speculative_tokens": 2, "draft_vocab_size": 999}, "draft vocabulary size 999"),
    ],
)
def test_bad_config_is_one_clear_error(spec, needle):
    with pytest.raises(SpeculativeConfigError) as info:
        validate_speculative_config(spec, target_vocab_size=1000)
    assert needle in str(info.value)


def test_every_problem_is_named_in_the_one_error():
    with pytest.raises(SpeculativeConfigError) as info:
        validate_speculative_config(
            {"method": "nope", "num_speculative_tokens": 0, "draft_vocab_size": 5}, target_vocab_size=7
        )
    message = str(info.value)
    assert "'nope'" in message and "got 0" in message and "size 5 differs from the target's 7" in message


def test_vocab_from_model_configs():
    class Hf:
        vocab_size = 1000

    class Draft:
        hf_config = Hf()
        architectures = ["LlamaForCausalLM"]

        def get_vocab_size(self):
            return 1000

    class Spec:
        method = "draft_model"
        num_speculative_tokens = 2
        draft_model_config = Draft()
        model = "d"

    assert validate_speculative_config(Spec(), target_vocab_size=1000) == "draft_model"
    Hf.draft_vocab_size = 500  # a truncated draft vocabulary is what the draft proposes from
    with pytest.raises(SpeculativeConfigError, match="size 500"):
        validate_speculative_config(Spec(), target_vocab_size=1000)
    Spec.method = "eagle3"  # ... unless the draft maps it into the target's (EAGLE-3's d2t): its vocab_size counts
    assert validate_speculative_config(Spec(), target_vocab_size=1000) == "eagle"
    with pytest.raises(SpeculativeConfigError, match="size 1000"):
        validate_speculative_config(Spec(), target_vocab_size=999)


@pytest.mark.parametrize(
    ("method", "archs", "family"),
    [
        ("dspark", (), "dspark"),
        ("dflash", ("DFlashDraftModel",), "dflash"),
        ("dflash", ("DFlash2DraftModel",), "dflash2"),
        ("mtp", (), "mtp"),
        ("deepseek_mtp", (), "mtp"),
        ("eagle", (), "eagle"),
        ("eagle3", (), "eagle"),
        ("draft_model", (), "draft_model"),
        ("ngram", (), "ngram"),
    ],
)
def test_method_family(method, archs, family):
    assert method_family(method, archs) == family


def test_dispatch_order_and_classes():
    assert DISPATCH_ORDER == ("dspark", "dflash", "mtp", "eagle")

    class Spec:
        def __init__(self, method, archs=()):
            self.method = method
            self.draft_model_config = type("D", (), {"architectures": list(archs)})()

    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

    expected = {
        ("dspark",): DSparkSpeculator,
        ("dflash",): DFlashSpeculator,
        ("dflash", "DFlash2DraftModel"): DFlash2Speculator,
        ("mtp",): MTPSpeculator,
        ("eagle",): EagleSpeculator,
        ("eagle3",): EagleSpeculator,
    }
    for (method, *archs), upstream in expected.items():
        cls = select_speculator(Spec(method, archs))
        assert issubclass(cls, upstream) and cls.__module__.startswith("ascend_specdecode.")
    # DSpark subclasses DFlash upstream: checked first, it must not resolve to the DFlash speculator.
    assert not issubclass(select_speculator(Spec("dflash")), DSparkSpeculator)
    assert set(SPECULATOR_CLASSES) == {"dspark", "dflash", "dflash2", "mtp", "eagle", "ngram"}
    # V1's CUDA n-gram proposer (CUDA streams and events); `ngram` drafts the same n-grams on both runners.
    with pytest.raises(ValueError, match="'ngram_gpu' is not a speculative method"):
        select_speculator(Spec("ngram_gpu"))


def test_dflash2_model_factories():
    from vllm.model_executor.models.qwen3_dflash2 import DFlash2Qwen3ForCausalLM, DFlash2Qwen3Model

    from ascend_specdecode.models import dflash2

    assert issubclass(dflash2.AscendDFlash2Qwen3ForCausalLM, DFlash2Qwen3ForCausalLM)
    assert dflash2.AscendDFlash2Qwen3ForCausalLM.model_cls is dflash2.AscendDFlash2Qwen3Model
    assert issubclass(dflash2.AscendDFlash2Qwen3Model, DFlash2Qwen3Model)
    assert dflash2.AscendDFlash2Qwen3Model.decoder_layer_cls is dflash2.AscendDFlash2Qwen3DecoderLayer


def test_lilicorr_drafts_are_refused_not_run_as_dflash():
    """vLLM drafts a LiLiCorr checkpoint with its own speculator; DFlash's would drop its correlator silently."""
    with pytest.raises(ValueError, match="LiLiCorrDraftModel draft"):
        method_family("dflash", ["LiLiCorrDraftModel"])

    class Spec:
        method = "dflash"
        num_speculative_tokens = 2
        draft_model_config = type("D", (), {"architectures": ["LiLiCorrDraftModel"]})()

    with pytest.raises(SpeculativeConfigError, match="LiLiCorr correlator drafts"):
        validate_speculative_config(Spec())


@pytest.mark.parametrize(
    ("probe", "needle"), [("use_multi_module_mtp", "multi-module MTP"), ("use_gemma4_mtp", "Gemma4 MTP")]
)
def test_mtp_variants_with_their_own_upstream_speculator_are_refused(probe, needle):
    class Spec:
        method = "mtp"
        num_speculative_tokens = 2
        draft_model_config = None

        def use_multi_module_mtp(self):
            return probe == "use_multi_module_mtp"

        def use_gemma4_mtp(self):
            return probe == "use_gemma4_mtp"

    with pytest.raises(ValueError, match=needle):
        select_speculator(Spec())
    with pytest.raises(SpeculativeConfigError, match=needle):
        validate_speculative_config(Spec())
