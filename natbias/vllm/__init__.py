"""The natural bias in vLLM: a plugin that serves a model saved by
:mod:`natbias.hf` with vLLM's own class of its family.

Installed beside vLLM (``pip install fairseq-natbias`` in vLLM's
environment), :func:`register` is found through the ``vllm.general_plugins``
entry point and run by vLLM in each of its processes, so that

    vllm.LLM("saved_natbias_model")
    python -m vllm.entrypoints.openai.api_server --model saved_natbias_model

load it as trained (:mod:`natbias.vllm.models`; lambda * b per request:
:mod:`natbias.vllm.bias_scale`).
"""


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: ``natbias-<type>``
    configurations known to transformers' ``AutoConfig`` (as ``import
    natbias.hf`` makes them), and ``NaturalBias<X>`` architectures known to
    vLLM's ``ModelRegistry``, each loaded when first asked for."""
    import natbias.hf  # noqa: F401  (installs the natbias-<type> configurations)
    from natbias.vllm.models import register_architectures

    register_architectures()
