"""Engines keep private vLLM caches but share what vLLM learned about model classes."""

from ascend_testkit.engine.env import vllm_cache_root


def test_model_infos_are_shared_and_everything_else_private(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_VLLM_CACHE", str(tmp_path / "ascend"))
    a = vllm_cache_root(tmp_path / "a")
    b = vllm_cache_root(tmp_path / "b")
    (a / "modelinfos" / "vllm-llama.json").write_text("{}")
    assert (b / "modelinfos" / "vllm-llama.json").read_text() == "{}"
    (a / "torch_compile_cache").mkdir()
    assert not (b / "torch_compile_cache").exists()
    assert vllm_cache_root(tmp_path / "a") == a  # a second engine in the same folder keeps the link
    assert (a / "modelinfos").resolve().parent == (tmp_path / "ascend" / "vllm-modelinfos")
