"""Long texts in links: a link carries a text of up to `state.MAX_URL_TEXT` characters itself, and a longer one
(a pasted article, a 2,048-token prompt) as a reference, `?text_ref=<16 hex>`, to a copy kept on this server.

A reload would send a long text in the request line, so it never goes in the URL. Before this store, a copied link
of a long prompt opened on the model's example. The copy is plain UTF-8 text in a folder (safe to read back, nothing
is unpickled), named by its SHA-256, so the same text always gives the same link and another replica on this
machine finds it too. The folder is bounded in bytes: the least recently used texts go first, and a link whose text
has gone says so (state.seed_from_query).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

MAX_BYTES = 64 * 2**20  # all kept texts together; ~1,600 prompts of SmolLM2's whole 8,192-token context
MAX_TEXT_BYTES = 2 * 2**20  # one text: far over any model's context, so no real prompt is refused
REF = re.compile(r"[0-9a-f]{16}")  # what a link may name: nothing else reaches the file system
_lock = threading.Lock()


def folder() -> Path:
    """Where the texts are kept: $ATTENTION_LAB_TEXTS, else the user's cache folder."""
    env = os.environ.get("ATTENTION_LAB_TEXTS")
    return Path(env) if env else Path.home() / ".cache" / "attention-lab" / "texts"


def ref_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def put(text: str) -> str | None:
    """Keep `text` and return its reference; None if it cannot be kept (too big, a read-only disk): the page then
    says the link does not carry it, as before."""
    data = text.encode("utf-8")
    if len(data) > MAX_TEXT_BYTES:
        return None
    ref = ref_of(text)
    try:
        with _lock:
            d = folder()
            path = d / f"{ref}.txt"
            if path.exists():
                os.utime(path)  # used again: the last to go
                return ref
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, suffix=".tmp", delete=False) as f:
                f.write(data)
            os.replace(f.name, path)  # whole or not at all: another replica never reads half a text
            _trim(d)
    except OSError:
        return None
    return ref


def get(ref: str) -> str | None:
    """The text a link's reference names, or None (not a reference, or not kept here: another server, or trimmed)."""
    if not isinstance(ref, str) or not REF.fullmatch(ref):
        return None
    path = folder() / f"{ref}.txt"
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if ref_of(text) != ref:  # a file changed on disk is not the text the link was made for
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return text


def _trim(d: Path) -> None:
    """Least recently used texts out until the folder is under MAX_BYTES (the newest always stays)."""
    files = []
    for p in d.glob("*.txt"):
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    files.sort()
    total = sum(size for _, size, _ in files)
    for _, size, p in files[:-1]:
        if total <= MAX_BYTES:
            break
        try:
            p.unlink()
        except OSError:
            pass
        total -= size
