"""Hugging Face Hub repo ids -> a local folder (or .gguf file) in the Hub cache.

    load_model("org/name")             a Hugging Face model repo: config.json + safetensors + tokenizer.json
    load_model("org/name:file.gguf")   one GGUF file of a repo
    load_model("org/name")             a GGUF-only repo (no config.json) holding exactly one .gguf file

The cache is tried first (no network); only when the repo is not cached, or its snapshot lacks
a file the loader needs, is it downloaded -- unless HF_HUB_OFFLINE=1, in which case a missing
repo is a FileNotFoundError that names the repo and the cache folder searched. The cache folder
is huggingface_hub's: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub. Environment
variables are read at call time (huggingface_hub reads them once, at import).

huggingface_hub is imported only when a repo id is resolved.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

# What minillm/loader/hf.py reads from a model folder (the rest of a repo -- other weight
# formats, ONNX exports, README images -- is never downloaded).
HF_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*",
]

# Hub ids (huggingface_hub's validator): "org/name", each part letters, digits, '-', '_', '.',
# starting and ending with a letter, digit or '_' (so "./x", "../x", "~/x" stay paths), no "--"
# or "..", 96 characters at most. An optional ":file.gguf" picks one GGUF file of the repo.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_GGUF_FILE = re.compile(r"[^:\\]+\.gguf", re.IGNORECASE)
_TRUE = {"1", "on", "yes", "true"}


def _split(s: str) -> tuple[str, str | None]:
    """'org/name' -> ('org/name', None); 'org/name:file.gguf' -> ('org/name', 'file.gguf')."""
    repo, sep, filename = s.partition(":")
    return repo, (filename if sep else None)


def looks_like_repo_id(s: str) -> bool:
    """True for "org/name" (or "org/name:file.gguf") that is not an existing local path."""
    s = str(s)
    repo, filename = _split(s)
    if not _REPO_ID.fullmatch(repo) or ".." in repo or "--" in repo or len(repo) > 96:
        return False
    if filename is not None and not _GGUF_FILE.fullmatch(filename):
        return False
    return not Path(s).expanduser().exists()


def hub_cache_dir() -> Path:
    """The Hub cache folder, from the environment as it is now."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(os.path.expandvars(env[var])).expanduser()
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(env["HF_HOME"])).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set now, or when huggingface_hub was imported."""
    from huggingface_hub import constants

    env = os.environ
    now = any(env.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or now


def _hf_folder_complete(folder: Path) -> bool:
    """config.json, tokenizer.json and every safetensors file the weights need are present."""
    if not ((folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()):
        return False
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return False
        return bool(shards) and all((folder / s).is_file() for s in shards)
    return (folder / "model.safetensors").is_file()


def _ggufs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() == ".gguf" and p.is_file())


def _not_cached(repo_id: str, cache_dir: Path, why: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"no model at {repo_id!r}: not a local path, and the Hugging Face Hub repo {repo_id!r} is not in "
        f"the Hub cache ({cache_dir}) or not completely; {why}"
    )


def _offline_hint(repo_id: str) -> str:
    return (
        f"HF_HUB_OFFLINE=1 forbids downloading it: download it first (`hf download {repo_id}`, "
        f"or snapshot_download) or unset HF_HUB_OFFLINE"
    )


def _snapshot(repo: str, revision: str | None, patterns: list[str], cache_dir: Path, local_only: bool) -> Path:
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            repo,
            revision=revision,
            cache_dir=str(cache_dir),
            allow_patterns=patterns,
            local_files_only=local_only,
        )
    )


def _download(repo: str, revision: str | None, patterns: list[str], cache_dir: Path, full_id: str) -> Path:
    """snapshot_download online, with the Hub's errors turned into a FileNotFoundError naming the repo."""
    from huggingface_hub.utils import RepositoryNotFoundError

    try:
        return _snapshot(repo, revision, patterns, cache_dir, local_only=False)
    except RepositoryNotFoundError as e:  # also gated repos
        raise FileNotFoundError(
            f"no model at {full_id!r}: not a local path, and the Hugging Face Hub has no repo {repo!r} "
            f"you can access (private or gated repos need `hf auth login`): {e}"
        ) from e
    except FileNotFoundError as e:  # LocalEntryNotFoundError: the Hub could not be reached
        raise _not_cached(full_id, cache_dir, f"downloading it failed ({e})") from e


def _pick_gguf(repo_id: str, folder: Path, remote: list[str] | None = None) -> str | None:
    """The one .gguf of a repo (relative name), None if it has none; several is an error."""
    names = remote if remote is not None else [str(p.relative_to(folder)) for p in _ggufs(folder)]
    names = sorted(n for n in names if n.lower().endswith(".gguf"))
    if len(names) > 1:
        from minillm.loader.base import ModelLoadError

        listed = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
        raise ModelLoadError(
            repo_id, f"has no config.json and {len(names)} .gguf files ({listed}); pick one as {repo_id}:FILE.gguf"
        )
    return names[0] if names else None


def resolve_hub_model(repo_id: str, revision: str | None = None) -> Path:
    """A Hub repo id -> a local model folder, or a .gguf file, in the Hub cache.

    "org/name" is a Hugging Face model folder (config.json, safetensors, tokenizer.json); if
    the repo has no config.json but .gguf files, its single .gguf (several: name one, as
    "org/name:file.gguf"). The cache is searched first; then, unless offline
    (HF_HUB_OFFLINE=1), the files minillm reads are downloaded. A repo that is neither
    cached nor downloadable is a FileNotFoundError naming the repo id and the cache folder.
    """
    repo, filename = _split(str(repo_id))
    cache_dir = hub_cache_dir()
    offline = hub_offline()
    patterns = [filename] if filename else HF_PATTERNS

    def usable(folder: Path) -> bool:
        if filename:
            return (folder / filename).is_file()
        return _hf_folder_complete(folder) or (not (folder / "config.json").is_file() and bool(_ggufs(folder)))

    folder: Path | None
    partial = ""
    try:
        folder = _snapshot(repo, revision, patterns, cache_dir, local_only=True)
    except FileNotFoundError as e:  # LocalEntryNotFoundError, or IncompleteSnapshotError (a partial snapshot)
        folder = None
        partial = f"only part of it is cached ({e}); " if getattr(e, "snapshot_path", None) else ""
    if folder is None or not usable(folder):
        if offline:
            if folder is None:
                raise _not_cached(repo_id, cache_dir, partial + _offline_hint(repo))
            # A partial snapshot: the checks below, or the loader, say which file is missing.
        else:
            folder = _download(repo, revision, patterns, cache_dir, repo_id)

    if filename:
        path = folder / filename
        if not path.is_file():
            hint = f"; {_offline_hint(repo)}" if offline else ""
            raise FileNotFoundError(
                f"no model at {repo_id!r}: the Hugging Face Hub repo {repo!r} (snapshot {folder}) has no file "
                f"{filename!r}{hint}"
            )
        return path
    if (folder / "config.json").is_file():
        return folder
    # No config.json: a GGUF repo.
    name = _pick_gguf(repo_id, folder)
    if name is None and not offline:
        from huggingface_hub import HfApi

        name = _pick_gguf(repo_id, folder, HfApi().list_repo_files(repo, revision=revision))
        if name is not None:
            folder = _download(repo, revision, [name], cache_dir, repo_id)
    if name is None:
        return folder  # the loader reports the missing config.json, naming the snapshot folder
    return folder / name
