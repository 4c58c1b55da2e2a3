"""GGUF files (llama.cpp's single-file format): header, metadata, tensors, dequantization, HF names.

A GGUF holds the metadata as typed key/value pairs, then one info record per tensor, then the
tensor bytes (each tensor aligned, quantized in blocks along its rows). This module reads all of
that without trusting it:

- the header is walked with bounds checks before anything is built: every count and length must
  fit in the bytes that are left, arrays hold at most MAX_ARRAY_ITEMS items in all, tensors must lie
  inside the file, so a truncated, garbage or forged file costs bounded memory and ends in a
  `GGUFError` that says what is wrong (never a traceback from deep inside numpy);
- tensor bytes are memory-mapped (np.memmap, as gguf.GGUFReader does), never read twice;
- dequantization (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) is
  vectorized numpy over chunks of blocks written straight into the output tensor; results are
  bit-identical to gguf.quants.dequantize (the reference transformers uses), and several times faster
  (bench/llm.py); the IQ and TQ types are refused by name;
- `hf_config` / `hf_tensors` turn the architectures in ARCHITECTURES (llama incl. Mistral and Llama 3's
  rope_freqs, qwen2, qwen3, gemma, gemma2, gemma3, phi3, olmo2, gptneox, qwen2moe) into a Hugging Face
  config dict and HF-named tensors, undoing what llama.cpp's convert_hf_to_gguf.py did to each family
  (llama's q/k row permutation, on the quantized rows before dequantizing; gemma's +1 on norm weights;
  gpt-neox's regrouped qkv; qwen2moe's stacked experts), so `model.loaders.hf.lm_from_hf` loads them.
  tests/test_gguf_families.py writes each family as the converter does and compares with transformers.

gguf.GGUFReader parses this header in ~1.5 s (a numpy view per string); the walker below does it in a
fraction of that, and tests/test_gguf.py checks it returns what GGUFReader returns.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.loaders.errors import GGUFError  # defined apart so bpe.py need not import this module

MAGIC = b"GGUF"
MAX_ARRAY_ITEMS = 1 << 23  # all metadata arrays together (a 262k vocabulary with merges is ~0.8M)
MAX_TENSORS = 1 << 16
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block); only the types we dequantize.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 8: ("Q8_0", 32, 34),
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
# Names of other ggml types, so a message can say what the file holds. The IQ types (lattice codebooks
# of 256-512 entries each) and the ternary TQ types are refused by name.
_OTHER_TYPES = {9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS",
                17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
                24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0"}
SUPPORTED_TYPES = tuple(name for name, _, _ in GGML_TYPES.values())

# metadata value type id -> struct code (8 = string, 9 = array are handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8", 11: "i8", 12: "f8"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # numpy/torch order (rows first); GGUF stores ggml's ne (columns first)
    offset: int  # absolute, in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (_OTHER_TYPES.get(self.ggml_type, f"type {self.ggml_type}"),))[0]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class GGUFFile:
    """A parsed GGUF: metadata (plain Python values), tensor infos, and the memory-mapped bytes."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data: np.ndarray = field(repr=False)  # np.memmap of the whole file, uint8

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes (a view into the memory map, nothing copied)."""
        info = self.tensors[name]
        return self.data[info.offset : info.offset + info.n_bytes]

    def dequantize(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        info = self.tensors[name]
        return dequantize(self.raw(name), info.ggml_type, info.shape, out=out)


class _Cursor:
    """Reads little- or big-endian values from a buffer; every read is bounds-checked."""

    def __init__(self, buf, size: int, order: str):
        self.buf, self.size, self.pos, self.order = buf, size, 0, order

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"GGUF file is truncated or corrupt: {what} needs {n:,} bytes at offset {self.pos:,}, "
                            f"but the file has {self.size:,} bytes.")

    def scalar(self, code: str, what: str):
        n = struct.calcsize(code)
        self.need(n, what)
        (value,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # llama.cpp stores some byte tokens as invalid UTF-8; keep them readable, never fail on them
            return raw.decode("utf-8", errors="replace")


def _read_value(cur: _Cursor, vtype: int, key: str, budget: list[int]):
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], f"the value of {key!r}")
    if vtype == 8:
        return cur.string(f"the string {key!r}")
    if vtype == 9:
        itype = cur.scalar("I", f"the item type of {key!r}")
        count = cur.scalar("Q", f"the length of {key!r}")
        if itype == 9:
            raise GGUFError(f"GGUF metadata {key!r} is an array of arrays; this reader does not accept nested arrays.")
        if itype not in _SCALARS and itype != 8:
            raise GGUFError(f"GGUF metadata {key!r} has an unknown item type {itype}: the file is corrupt.")
        budget[0] -= count
        if budget[0] < 0:
            raise GGUFError(f"GGUF metadata arrays claim more than {MAX_ARRAY_ITEMS:,} items in all "
                            f"({key!r} alone claims {count:,}): refused.")
        if itype == 8:
            cur.need(8 * count, f"the {count:,} strings of {key!r}")  # each string has at least its length
            return [cur.string(f"item {i} of {key!r}") for i in range(count)]
        dtype = np.dtype(_NUMPY[itype]).newbyteorder(cur.order)
        cur.need(dtype.itemsize * count, f"the {count:,} items of {key!r}")
        values = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos)
        cur.pos += dtype.itemsize * count
        return values.astype(dtype.newbyteorder("="), copy=True).tolist()
    raise GGUFError(f"GGUF metadata {key!r} has an unknown value type {vtype}: the file is corrupt.")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate a GGUF file's header; tensor data stays memory-mapped."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise GGUFError(f"{path} is not a file.")
    except OSError as e:
        raise GGUFError(f"Cannot read {path}: {e.strerror or e}.") from e
    if size < 24:
        raise GGUFError(f"{path.name} is not a GGUF file: {size} bytes, shorter than a GGUF header (24 bytes).")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, buf, size)
    except GGUFError:
        buf.close()
        raise


def _parse(path: Path, buf: mmap.mmap, size: int) -> GGUFFile:
    if buf[:4] != MAGIC:
        raise GGUFError(f"{path.name} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF').")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # a big-endian file (llama.cpp writes those for s390x)
        order, version = ">", struct.unpack_from(">I", buf, 4)[0]
    if version not in (2, 3):
        raise GGUFError(f"{path.name}: GGUF version {version} is not supported (versions 2 and 3 are).")
    cur = _Cursor(buf, size, order)
    cur.pos = 8
    n_tensors = cur.scalar("Q", "the tensor count")
    n_kv = cur.scalar("Q", "the metadata count")
    if n_tensors > MAX_TENSORS:
        raise GGUFError(f"{path.name} claims {n_tensors:,} tensors (at most {MAX_TENSORS:,} are accepted).")
    if n_kv * 13 > size:  # a key/value pair takes at least 13 bytes
        raise GGUFError(f"{path.name} claims {n_kv:,} metadata entries, more than its {size:,} bytes can hold "
                        "(truncated or corrupt).")
    metadata: dict[str, Any] = {}
    budget = [MAX_ARRAY_ITEMS]
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        vtype = cur.scalar("I", f"the type of {key!r}")
        metadata[key] = _read_value(cur, vtype, key, budget)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise GGUFError(f"{path.name}: general.alignment {alignment!r} is not a power of two.")
    infos = []
    for i in range(n_tensors):
        name = cur.string(f"the name of tensor {i}")
        n_dims = cur.scalar("I", f"the rank of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{path.name}: tensor {name!r} claims {n_dims} dimensions (1 to {MAX_DIMS} are valid).")
        cur.need(8 * n_dims, f"the shape of {name!r}")
        ne = struct.unpack_from(f"{order}{n_dims}Q", buf, cur.pos)
        cur.pos += 8 * n_dims
        ggml_type = cur.scalar("I", f"the type of {name!r}")
        offset = cur.scalar("Q", f"the offset of {name!r}")
        infos.append((name, ne, ggml_type, offset))
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, ne, ggml_type, offset in infos:
        if name in tensors:
            raise GGUFError(f"{path.name}: tensor {name!r} appears twice.")
        if any(d == 0 for d in ne) or any(d > size * 8 for d in ne):
            raise GGUFError(f"{path.name}: tensor {name!r} has an impossible shape {list(ne)}.")
        if ggml_type not in GGML_TYPES:
            kind = _OTHER_TYPES.get(ggml_type)
            if kind:
                raise GGUFError(f"{path.name}: quantization type {kind} (tensor {name!r}) is not supported; "
                                f"supported: {', '.join(SUPPORTED_TYPES)}.")
            raise GGUFError(f"{path.name}: tensor {name!r} has an unknown type id {ggml_type} (corrupt file?); "
                            f"supported: {', '.join(SUPPORTED_TYPES)}.")
        type_name, block, block_bytes = GGML_TYPES[ggml_type]
        if ne[0] % block:
            raise GGUFError(f"{path.name}: tensor {name!r} rows of {ne[0]} are not whole {type_name} blocks "
                            f"of {block}.")
        n_elements = 1
        for d in ne:
            n_elements *= d
        n_bytes = n_elements // block * block_bytes
        start = data_start + offset
        if offset % alignment or start + n_bytes > size:
            raise GGUFError(f"{path.name}: tensor {name!r} ({type_name}, shape {list(ne[::-1])}, {n_bytes:,} bytes at "
                            f"offset {start:,}) lies outside the file ({size:,} bytes): truncated or forged.")
        tensors[name] = TensorInfo(name, ggml_type, tuple(int(d) for d in ne[::-1]), start, n_bytes)
    data = np.frombuffer(buf, dtype=np.uint8)
    return GGUFFile(path=path, version=version, metadata=metadata, tensors=tensors, data=data)


# ---------------------------------------------------------------- dequantization

_CHUNK_BLOCKS = 1 << 14  # blocks per step: temporaries stay ~2 MB, in cache


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f2").astype(np.float32)


def _q8_0(b: np.ndarray, y: np.ndarray) -> None:  # d (f16) | 32 x int8
    d = _f16(b[:, 0:2])
    np.multiply(b[:, 2:].view(np.int8), d, out=y, dtype=np.float32)


def _nibbles(qs: np.ndarray, n: int) -> np.ndarray:
    """[blocks, n/2] bytes -> [blocks, n] values: low nibbles are the first half, high nibbles the second."""
    out = np.empty((qs.shape[0], n), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[:, : n // 2])
    np.right_shift(qs, 4, out=out[:, n // 2 :])
    return out


def _q4_0(b: np.ndarray, y: np.ndarray) -> None:  # d | 16 bytes of nibbles, value = d * (q - 8)
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:], 32).view(np.int8) - np.int8(8)
    np.multiply(d, q, out=y, dtype=np.float32)


def _q4_1(b: np.ndarray, y: np.ndarray) -> None:  # d | m | 16 bytes of nibbles, value = d * q + m
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    np.multiply(d, _nibbles(b[:, 4:], 32), out=y, dtype=np.float32)
    y += m


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray, y: np.ndarray) -> None:  # d | dmin | 12 scale bytes | 128 bytes: 4 x (32 lo, 32 hi)
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, 8, 32)
    y3 = y.reshape(n, 8, 32)
    np.multiply((d * sc)[:, :, None], q, out=y3, dtype=np.float32)
    y3 -= (dmin * mn)[:, :, None]


def _q6_k(b: np.ndarray, y: np.ndarray) -> None:  # 128 ql | 64 qh | 16 int8 scales | d
    n = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
    lo = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    hi = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(0x03)
    q = (lo.reshape(n, 2, 4, 32) | (hi << np.uint8(4))).view(np.int8) - np.int8(32)
    y3 = y.reshape(n, 16, 16)
    np.multiply((d * sc.astype(np.float32))[:, :, None], q.reshape(n, 16, 16), out=y3, dtype=np.float32)


def _bits(raw: np.ndarray, n: int) -> np.ndarray:
    """[blocks, n/8] bytes -> [blocks, n] single bits, least significant bit first (bit i = element i)."""
    return np.unpackbits(raw, axis=1, count=n, bitorder="little")


def _q5_0(b: np.ndarray, y: np.ndarray) -> None:  # d | 4 bytes: 5th bits | 16 bytes of nibbles; d * (q - 16)
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:], 32) | (_bits(b[:, 2:6], 32) << np.uint8(4))).view(np.int8) - np.int8(16)
    np.multiply(d, q, out=y, dtype=np.float32)


def _q5_1(b: np.ndarray, y: np.ndarray) -> None:  # d | m | 4 bytes: 5th bits | 16 bytes of nibbles; d * q + m
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:], 32) | (_bits(b[:, 4:8], 32) << np.uint8(4))
    np.multiply(d, q, out=y, dtype=np.float32)
    y += m


def _q2_k(b: np.ndarray, y: np.ndarray) -> None:  # 16 bytes (4-bit scale, 4-bit min) | 64 bytes of crumbs | d | dmin
    n = b.shape[0]
    sc, d, dmin = b[:, :16], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = d * (sc & np.uint8(0x0F)).astype(np.float32)  # (n, 16): one scale per 16 values
    ml = dmin * (sc >> np.uint8(4)).astype(np.float32)
    shift = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> shift) & np.uint8(3)).reshape(n, 16, 16)
    y3 = y.reshape(n, 16, 16)
    np.multiply(dl[:, :, None], q, out=y3, dtype=np.float32)
    y3 -= ml[:, :, None]


def _q3_k(b: np.ndarray, y: np.ndarray) -> None:  # 32 bytes high-bit mask | 64 bytes of crumbs | 12 scale bytes | d
    n = b.shape[0]
    hmask, qs, s, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    # sixteen 6-bit scales: low 4 bits in bytes 0-7 (two per byte), high 2 bits in bytes 8-11 (four per byte)
    lo = (s[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (s[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & np.uint8(0x0F)) | ((hi & np.uint8(0x03)) << np.uint8(4))).view(np.int8) - np.int8(32)
    dl = d * sc.astype(np.float32)  # (n, 16)
    ql = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    qh = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)
    # a clear mask bit subtracts 4 (ggml stores the bit inverted)
    q = ql.reshape(n, 16, 16).view(np.int8) - ((qh.reshape(n, 16, 16) ^ np.uint8(1)) << np.uint8(2)).view(np.int8)
    np.multiply(dl[:, :, None], q, out=y.reshape(n, 16, 16), dtype=np.float32)


def _q5_k(b: np.ndarray, y: np.ndarray) -> None:  # d | dmin | 12 scale bytes | 32 bytes 5th bits | 128 bytes of nibbles
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    ql = (b[:, 48:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    qh = (b[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)
    q = ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << np.uint8(4))
    y3 = y.reshape(n, 8, 32)
    np.multiply((d * sc)[:, :, None], q, out=y3, dtype=np.float32)
    y3 -= (dmin * mn)[:, :, None]


_BLOCK_FNS = {8: _q8_0, 2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k,
              14: _q6_k}


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...],
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize a tensor's raw bytes into a float32 torch tensor of `shape` (written into `out` if given)."""
    if ggml_type not in GGML_TYPES:
        raise GGUFError(f"quantization type {_OTHER_TYPES.get(ggml_type, ggml_type)} is not supported; supported: "
                        f"{', '.join(SUPPORTED_TYPES)}.")
    name, block, block_bytes = GGML_TYPES[ggml_type]
    n = int(np.prod(shape, dtype=np.int64))
    if raw.size != n // block * block_bytes or n % block:
        raise GGUFError(f"{name} tensor of shape {list(shape)} needs {n // block * block_bytes:,} bytes, "
                        f"got {raw.size:,}.")
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif tuple(out.shape) != tuple(shape) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of shape {list(shape)}")
    y = out.numpy().reshape(-1)
    raw = raw.reshape(-1)
    if ggml_type == 0:
        y[:] = raw.view("<f4")
    elif ggml_type == 1:
        y[:] = raw.view("<f2")
    elif ggml_type == 30:  # bfloat16: the high half of a float32
        y.view(np.uint32)[:] = raw.view("<u2").astype(np.uint32) << 16
    else:
        fn = _BLOCK_FNS[ggml_type]
        blocks, ys = raw.reshape(-1, block_bytes), y.reshape(-1, block)
        for s in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            fn(blocks[s : s + _CHUNK_BLOCKS], ys[s : s + _CHUNK_BLOCKS])
    return out


def unpermute_rows(raw: np.ndarray, rows: int, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of attn_q/attn_k rows, on the (quantized) row bytes.

    convert_hf_to_gguf.py's `permute` reshapes rows to (n_head, 2, rows/n_head/2) and swaps the last
    two axes (HF's rotate-half layout -> ggml's interleaved pairs); the inverse swaps them back, as
    transformers' `reverse_permute` does. Rows are quantized independently, so permuting bytes is exact.
    """
    row_bytes = raw.size // rows
    if rows % (2 * n_head):
        raise GGUFError(f"cannot undo the rotary permutation: {rows} rows are not a multiple of 2 x {n_head} heads.")
    r = raw.reshape(n_head, rows // n_head // 2, 2, row_bytes)
    return np.ascontiguousarray(r.swapaxes(1, 2)).reshape(-1)


# ---------------------------------------------------------------- names and config

# GGUF architecture (general.architecture) -> Hugging Face model_type. Mistral files say "llama": llama.cpp's
# converter writes them as llama and runs them without a sliding window, which is what we load; Mixtral files
# say "llama" too, and hold experts (blk.N.ffn_gate_inp): those become model_type "mixtral".
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2",
                 "gemma3": "gemma3_text", "phi3": "phi3", "olmo2": "olmo2", "gptneox": "gpt_neox",
                 "qwen2moe": "qwen2_moe", "olmoe": "olmoe"}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
            "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM", "olmoe": "OlmoeForCausalLM", "mixtral": "MixtralForCausalLM"}

# blk.N.<gguf> -> model.layers.N.<hf>, as gguf-py's tensor_mapping.py pairs them (llama first, then what differs)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_SANDWICH = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
             "post_ffw_norm": "post_feedforward_layernorm"}  # gemma2/3: a norm before and after each sublayer
# stacked [experts, rows, cols]: split into one tensor per expert, the names save_pretrained writes
_EXPERTS = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.{}.gate_proj",
            "ffn_up_exps": "mlp.experts.{}.up_proj", "ffn_down_exps": "mlp.experts.{}.down_proj"}
_MIXTRAL = {"ffn_gate_inp": "block_sparse_moe.gate", "ffn_gate_exps": "block_sparse_moe.experts.{}.w1",
            "ffn_down_exps": "block_sparse_moe.experts.{}.w2", "ffn_up_exps": "block_sparse_moe.experts.{}.w3"}
_ARCH_LAYER_NAMES = {
    "llama": _LAYER_NAMES | _MIXTRAL, "qwen2": _LAYER_NAMES, "gemma": _LAYER_NAMES,
    "qwen3": _LAYER_NAMES | _QK_NORM,
    "gemma2": _LAYER_NAMES | _SANDWICH,
    "gemma3": _LAYER_NAMES | _SANDWICH | _QK_NORM,
    "olmo2": {k: v for k, v in _LAYER_NAMES.items() if not k.endswith("_norm")} | _QK_NORM  # norms after sublayers
    | {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    # phi3 keeps q, k, v fused and gate, up fused, as HF's Phi3 does
    "phi3": {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_qkv": "self_attn.qkv_proj",
             "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
    "gptneox": {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_qkv": "attention.query_key_value", "attn_output": "attention.dense",
                "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
    "qwen2moe": {k: v for k, v in _LAYER_NAMES.items() if not k.startswith("ffn_") or k == "ffn_norm"} | _EXPERTS
    | {"ffn_gate_inp_shexp": "mlp.shared_expert_gate", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
       "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj"},
    "olmoe": {k: v for k, v in _LAYER_NAMES.items() if not k.startswith("ffn_") or k == "ffn_norm"} | _EXPERTS
    | _QK_NORM,
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_NEOX_TOP = {"token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm", "output": "embed_out"}
# llama.cpp's converter permutes q/k rows only where llama.cpp rotates interleaved pairs (rope type NORM)
_PERMUTED = {"llama"}
# and adds 1 to every gemma RMSNorm weight (HF's gemma norm computes x * (1 + w)); transformers subtracts it again
_NORM_PLUS_ONE = {"gemma", "gemma2", "gemma3"}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """GGUF tensor name -> Hugging Face name for `arch` (None: a tensor the model does not use).
    Stacked expert tensors get a '{}' where the expert's number goes."""
    base, _, kind = gguf_name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    top = _NEOX_TOP if arch == "gptneox" else _TOP_NAMES
    if base in top:
        return f"{top[base]}.{kind}"
    parts = base.split(".")
    layer = _ARCH_LAYER_NAMES.get(arch, _LAYER_NAMES)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer:
        prefix = "gpt_neox.layers" if arch == "gptneox" else "model.layers"
        return f"{prefix}.{int(parts[1])}.{layer[parts[2]]}.{kind}"
    return None


def _meta(g: GGUFFile, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    value = g.metadata.get(key, default)
    if value is ...:
        raise GGUFError(f"{g.path.name}: the metadata has no {key!r}; a {g.metadata.get('general.architecture')} "
                        "GGUF needs it.")
    if value is not None and value is not default and (isinstance(value, bool) or not isinstance(value, kind)):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        raise GGUFError(f"{g.path.name}: metadata {key!r} = {value!r} has the wrong type.")
    return value


def _tensor_shape(g: GGUFFile, name: str) -> tuple[int, ...]:
    if name not in g.tensors:
        raise GGUFError(f"{g.path.name}: tensor {name!r} is missing.")
    return g.tensors[name].shape


def _llama3_rope(g: GGUFFile, factors: np.ndarray, theta: float, head_dim: int, rope_dims: int) -> dict:
    """HF's llama3 rope parameters from the rope_freqs tensor llama.cpp's converter writes for Llama 3.1+.

    The converter stores, per frequency, the divisor llama3 scaling applies (1 for high frequencies,
    `factor` for low ones, a smooth blend between). HF's formula depends on original_max_position_embeddings
    (O), low_freq_factor (lf) and high_freq_factor (hf) only through the blend's line s = O/(2*pi) * f - ...,
    so we try Llama 3's own values (8192, 1, 4) first, else fit the line through the blended frequencies;
    either way the parameters must reproduce every stored factor, or the file is refused.
    """
    inv = 1.0 / theta ** (np.arange(0, rope_dims, 2, dtype=np.float64) / rope_dims)
    if factors.shape != inv.shape or not np.isfinite(factors).all() or (factors < 1 - 1e-6).any():
        raise GGUFError(f"{g.path.name}: rope_freqs holds {factors.size} factors for {inv.size} rotary "
                        "frequencies (or values below 1): not llama3 RoPE scaling.")
    factor = float(factors.max())
    wavelen = 2 * np.pi / inv

    def factors_of(old: float, lo: float, hi: float) -> np.ndarray:
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = 1 / ((1 - smooth) / factor + smooth)
        return np.where(wavelen < old / hi, 1.0, np.where(wavelen > old / lo, factor, mid))

    old = float(_meta(g, f"{g.metadata['general.architecture']}.rope.scaling.original_context_length", int, 8192))
    candidates = [(old, 1.0, 4.0)]
    mid = (factors > 1 + 1e-6) & (factors < factor - 1e-6 * factor)
    if mid.sum() >= 2:
        # the blend s = (O / wavelen - lf) / (hf - lf) is a line a / wavelen + b; with Llama 3's lf = 1,
        # hf - lf = -1 / b and O = -a / b
        s = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(1 / wavelen[mid], s, 1)
        if a > 0 > b:
            candidates.append((float(np.round(-a / b, 6)), 1.0, float(np.round(1 - 1 / b, 6))))
    for o, lo, hi in candidates:
        if hi > lo > 0 and np.allclose(factors_of(o, lo, hi), factors, rtol=1e-5, atol=0):
            return {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": lo,
                    "high_freq_factor": hi, "original_max_position_embeddings": int(o) if o == int(o) else o}
    raise GGUFError(f"{g.path.name}: the rope_freqs tensor does not follow Llama 3's RoPE scaling; "
                    "other per-frequency RoPE factors are not supported.")


def hf_config(g: GGUFFile) -> dict:
    """A Hugging Face config dict (the keys transformers 5 writes in config.json) from the file's metadata.

    Every size is checked against the tensors the file really holds, so absurd metadata is refused
    before any memory is spent on it.
    """
    arch = _meta(g, "general.architecture", str)
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{g.path.name}: architecture {arch!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    model_type = ARCHITECTURES[arch]
    p = f"{arch}."
    moe = "blk.0.ffn_gate_inp.weight" in g.tensors  # routed experts (qwen2moe, olmoe, a Mixtral in llama arch)
    if arch == "llama" and moe:
        model_type = "mixtral"
    n_layers = _meta(g, p + "block_count", int)
    d_model = _meta(g, p + "embedding_length", int)
    n_heads = _meta(g, p + "attention.head_count", int)
    n_kv = _meta(g, p + "attention.head_count_kv", int, n_heads)
    d_ff = _meta(g, p + "feed_forward_length", int)
    head_dim = _meta(g, p + "attention.key_length", int, d_model // max(n_heads, 1))
    vocab, d_embed = _tensor_shape(g, "token_embd.weight")
    fused = f"blk.{n_layers - 1}.attn_qkv.weight" in g.tensors  # phi3, gpt-neox
    q_name = "attn_qkv" if fused else "attn_q"
    n_experts = _meta(g, p + "expert_count", int, 0) if moe else 0
    if fused:
        heads_ok = n_heads >= 1 and _tensor_shape(g, "blk.0.attn_qkv.weight") == ((n_heads + 2 * n_kv) * head_dim,
                                                                                   d_model)
        kv_ok = n_kv >= 1 and n_heads % n_kv == 0
    else:
        heads_ok = n_heads >= 1 and _tensor_shape(g, "blk.0.attn_q.weight") == (n_heads * head_dim, d_model)
        kv_ok = (n_kv >= 1 and n_heads % n_kv == 0
                 and _tensor_shape(g, "blk.0.attn_k.weight") == (n_kv * head_dim, d_model))
    if moe:
        d_ff_ok = True  # every layer routes to experts: their sizes are checked below
    else:
        d_ff_ok = _tensor_shape(g, "blk.0.ffn_up.weight") == ((2 if arch == "phi3" else 1) * d_ff, d_model)
    checks = {
        "block_count": (n_layers, 1 <= n_layers and f"blk.{n_layers - 1}.{q_name}.weight" in g.tensors
                        and f"blk.{n_layers}.{q_name}.weight" not in g.tensors),
        "embedding_length": (d_model, d_model == d_embed),
        "attention.head_count": (n_heads, heads_ok),
        "attention.head_count_kv": (n_kv, kv_ok),
        "feed_forward_length": (d_ff, d_ff_ok),
    }
    for key, (value, ok) in checks.items():
        if not ok:
            raise GGUFError(f"{g.path.name}: metadata {p}{key} = {value} does not match the tensors in the file.")
    theta = float(_meta(g, p + "rope.freq_base", float, 10000.0))
    rope_dims = _meta(g, p + "rope.dimension_count", int, head_dim)
    if not (0 < rope_dims <= head_dim and rope_dims % 2 == 0):
        raise GGUFError(f"{g.path.name}: metadata {p}rope.dimension_count = {rope_dims} does not fit heads of "
                        f"{head_dim} dimensions.")
    if rope_dims != head_dim and arch not in ("gptneox", "phi3"):
        raise GGUFError(f"{g.path.name}: partial rotary ({rope_dims} of {head_dim} dims) is not supported for {arch}.")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = _meta(g, p + "rope.scaling.type", str, None)
    if scaling == "linear":
        rope = {"rope_type": "linear", "rope_theta": theta, "factor": float(_meta(g, p + "rope.scaling.factor", float))}
    elif scaling not in (None, "none"):
        raise GGUFError(f"{g.path.name}: RoPE scaling {scaling!r} is not supported (plain, linear and Llama 3's are).")
    if "rope_freqs.weight" in g.tensors:
        if arch != "llama":
            raise GGUFError(f"{g.path.name}: per-frequency RoPE factors (rope_freqs) are supported for llama only.")
        rope = _llama3_rope(g, g.dequantize("rope_freqs.weight").numpy().astype(np.float64), theta, head_dim,
                            rope_dims)
    if any(n.startswith("rope_factors_") for n in g.tensors):
        raise GGUFError(f"{g.path.name}: long-context RoPE (rope_factors_long/short, Phi-3 128k) is not supported.")
    tied = "output.weight" not in g.tensors
    eps_key = p + ("attention.layer_norm_epsilon" if arch == "gptneox" else "attention.layer_norm_rms_epsilon")
    eps = float(_meta(g, eps_key, float, 1e-5 if arch == "gptneox" else 1e-6))
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_CLASSES[model_type]],
        "vocab_size": vocab,
        "hidden_size": d_model,
        "intermediate_size": d_ff,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": _meta(g, p + "context_length", int, 2048),
        "rms_norm_eps": eps,
        "rope_parameters": rope,
        "tie_word_embeddings": tied,
        "attention_bias": f"blk.0.{q_name}.bias" in g.tensors,
        "mlp_bias": False,
        "dtype": "float32",
    }
    window = _meta(g, p + "attention.sliding_window", int, 0)
    if arch in ("gemma", "gemma2", "gemma3"):
        config["hidden_act" if arch == "gemma" else "hidden_activation"] = "gelu_pytorch_tanh"
        if arch == "gemma":
            config.pop("attention_bias")
    if arch in ("gemma2", "gemma3"):
        config.pop("hidden_act")
        # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B models (46 or 62 layers):
        # 1/sqrt(d_model / n_heads); GGUF does not store HF's query_pre_attn_scalar
        big = n_layers == (46 if arch == "gemma2" else 62)
        config["query_pre_attn_scalar"] = d_model // n_heads if big else head_dim
        config["attn_logit_softcapping"] = _meta(g, p + "attn_logit_softcapping", float, None)
        config["final_logit_softcapping"] = _meta(g, p + "final_logit_softcapping", float, None)
        every = 2 if arch == "gemma2" else 6  # llama.cpp's swa pattern: the last layer of every group is global
        pattern = g.metadata.get(p + "attention.sliding_window_pattern")
        if isinstance(pattern, list) and len(pattern) == n_layers:
            sliding = [bool(x) for x in pattern]
        else:
            sliding = [(i + 1) % every != 0 for i in range(n_layers)]
        config["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
        config["sliding_window"] = window or None
        if arch == "gemma3":
            local = float(_meta(g, p + "rope.freq_base_swa", float, 10000.0))
            config["rope_parameters"] = {"full_attention": rope,
                                         "sliding_attention": {"rope_type": "default", "rope_theta": local}}
    if arch == "qwen2":
        config["use_sliding_window"] = False
    if arch == "phi3":
        config["rope_parameters"] = rope | {"partial_rotary_factor": rope_dims / head_dim}
        config["original_max_position_embeddings"] = _meta(g, p + "rope.scaling.original_context_length", int,
                                                           config["max_position_embeddings"])
        config["sliding_window"] = window or None
        config.pop("attention_bias")
        config.pop("mlp_bias")
    if arch == "gptneox":
        config |= {"hidden_act": "gelu", "layer_norm_eps": eps, "attention_bias": True,
                   "use_parallel_residual": bool(_meta(g, p + "use_parallel_residual", bool, True)),
                   "rope_parameters": rope | {"partial_rotary_factor": rope_dims / head_dim}}
        for key in ("rms_norm_eps", "num_key_value_heads", "head_dim", "mlp_bias"):
            config.pop(key)
    if arch in ("qwen2moe", "olmoe") and not moe:
        raise GGUFError(f"{g.path.name}: a {arch} file without routers (blk.0.ffn_gate_inp) is not supported.")
    if moe:
        used = _meta(g, p + "expert_used_count", int)
        d_exp = _meta(g, p + "expert_feed_forward_length", int) if arch == "qwen2moe" else d_ff
        for i in range(n_layers):
            if f"blk.{i}.ffn_gate_inp.weight" not in g.tensors:
                raise GGUFError(f"{g.path.name}: layer {i} has no router (dense layers among MoE layers are not "
                                "supported).")
        if not (1 <= used <= n_experts and _tensor_shape(g, "blk.0.ffn_gate_exps.weight") == (n_experts, d_exp,
                                                                                              d_model)):
            raise GGUFError(f"{g.path.name}: metadata {p}expert_count / expert_used_count / "
                            "expert_feed_forward_length do not match the tensors in the file.")
        config["num_experts_per_tok"] = used
        config.pop("mlp_bias")
    if arch == "qwen2moe":
        config |= {"num_experts": n_experts, "moe_intermediate_size": d_exp, "shared_expert_intermediate_size":
                   _meta(g, p + "expert_shared_feed_forward_length", int, 0), "norm_topk_prob":
                   bool(_meta(g, p + "expert_weights_norm", bool, False)), "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "qkv_bias": config.pop("attention_bias"), "use_sliding_window": False}
    if arch == "olmoe":
        config |= {"num_experts": n_experts, "norm_topk_prob": bool(_meta(g, p + "expert_weights_norm", bool, False)),
                   "clip_qkv": _meta(g, p + "attention.clamp_kqv", float, None)}
    if model_type == "mixtral":  # top-k weights renormalized, as llama.cpp runs a llama-arch MoE
        config |= {"num_local_experts": n_experts, "sliding_window": None}
        config.pop("attention_bias")
    for key, meta_key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        token_id = g.metadata.get(f"tokenizer.ggml.{meta_key}_token_id")
        config[f"{key}_token_id"] = int(token_id) if isinstance(token_id, int) and 0 <= token_id < vocab else None
    return config


def hf_tensors(g: GGUFFile, config: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor the model uses, one at a time.

    Undoes what llama.cpp's converter did to each family: llama's q/k row permutation, gemma's +1 on norm
    weights, gpt-neox's regrouping of the fused qkv rows (HF interleaves q, k, v per head; GGUF stacks all
    q rows, then k, then v), qwen2moe's stacking of the experts."""
    arch = g.metadata["general.architecture"]
    for name, info in g.tensors.items():
        target = hf_name(name, arch)
        if target is None:
            continue
        raw = g.raw(name)
        if arch in _PERMUTED and (".attn_q." in name or ".attn_k." in name):  # weights and biases alike
            heads = config["num_attention_heads"] if ".attn_q." in name else config["num_key_value_heads"]
            raw = unpermute_rows(raw, info.shape[0], heads)
        t = dequantize(raw, info.ggml_type, info.shape)
        if arch in _NORM_PLUS_ONE and name.endswith("norm.weight"):
            t -= 1.0
        if arch == "gptneox" and ".attn_qkv." in name:
            n, hd = config["num_attention_heads"], config["hidden_size"] // config["num_attention_heads"]
            t = t.reshape(3, n, hd, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()
        if "{}" in target:  # one tensor per expert
            for j in range(t.shape[0]):
                yield target.format(j), t[j]
            continue
        if name.endswith("ffn_gate_inp_shexp.weight") and t.dim() == 1:
            t = t.unsqueeze(0)  # HF's shared_expert_gate is a Linear(d_model, 1)
        yield target, t


# ---------------------------------------------------------------- a model's parts, with a dequantized cache

# llama.cpp ends generation at these control tokens too (llama-vocab.cpp: its end-of-generation texts)
_END_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|eom_id|>")
CACHE_FORMAT = "attention-lab-gguf-1"
CACHE_ENTRIES = 4  # dequantized models kept (least recently used go first); SmolLM2 takes 540 MB
_HEAD_BYTES = 4 << 20  # the header hash covers the metadata, the tensor infos and the first tensor bytes


@dataclass
class GGUFModel:
    """What a GGUF file holds, ready for `lm_from_hf`: HF config, HF-named float32 tensors, tokenizer."""

    config: dict
    tensors: dict[str, torch.Tensor]
    tokenizer: Any  # tokenizers.Tokenizer, or None: a file without tokenizer metadata runs on token ids
    chat_template: str | None
    # bos, eos, pad, eot, eom (int or None; the file's own), end: llama.cpp's end-of-generation ids (those and every
    # control token whose text is in _END_TEXTS; kept for reference: the lab stops at LanguageModel.stop_rule's)
    special_ids: dict[str, Any]
    source: Path
    from_cache: bool = False


def special_ids(metadata: dict, vocab: int) -> dict[str, Any]:
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    types = metadata.get("tokenizer.ggml.token_type") or []

    def valid(key: str) -> int | None:
        v = metadata.get(f"tokenizer.ggml.{key}")
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab else None

    ids = {"bos": valid("bos_token_id"), "eos": valid("eos_token_id"), "pad": valid("padding_token_id"),
           "eot": valid("eot_token_id"), "eom": valid("eom_token_id")}
    end = {i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None}
    end |= {i for i, (t, k) in enumerate(zip(tokens, types, strict=False)) if k == 3 and t in _END_TEXTS}
    ids["end"] = sorted(end)
    return ids


def lab_cache(sub: str) -> Path:
    """The lab's cache folder `sub`: $ATTENTION_LAB_CACHE/sub, else ~/.cache/attention-lab/sub (XDG)."""
    root = os.environ.get("ATTENTION_LAB_CACHE")
    if root:
        return Path(root) / sub
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-lab" / sub


def cache_dir() -> Path:
    """Where dequantized copies live (lab_cache("gguf"))."""
    return lab_cache("gguf")


def cache_key(path: Path) -> str:
    """The GGUF's identity: size, mtime and a hash of its first bytes (header, metadata, tensor infos)."""
    import hashlib

    st = path.stat()
    h = hashlib.sha256(f"{CACHE_FORMAT}:{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(_HEAD_BYTES))
    return h.hexdigest()


def _checksum(t: torch.Tensor) -> int:
    """A cheap content checksum (wrapping sum of 64-bit words): any flipped bit changes it."""
    b = t.contiguous().view(torch.uint8).numpy().reshape(-1)
    words = b[: b.size // 8 * 8].view("<u8")
    return int(words.sum(dtype=np.uint64)) + int(b[words.size * 8 :].sum(dtype=np.uint64))


def _write_cache(target: Path, part: GGUFModel, key: str) -> None:
    """Stream a safetensors file (8-byte header length, JSON header, raw bytes), then rename it into place.

    Written by hand, tensor by tensor, so no second copy of 540 MB is ever built in memory.
    """
    import json
    import tempfile

    names = sorted(part.tensors)
    header: dict[str, Any] = {}
    start = 0
    total = 0
    for n in names:
        t = part.tensors[n]
        size = t.numel() * 4
        header[n] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [start, start + size]}
        start += size
        total = (total + _checksum(t)) % (1 << 64)
    header["__metadata__"] = {
        "format": CACHE_FORMAT, "key": key, "checksum": str(total), "config": json.dumps(part.config),
        "tokenizer": part.tokenizer.to_str() if part.tokenizer is not None else "",
        "chat_template": json.dumps(part.chat_template),
        "special_ids": json.dumps(part.special_ids), "source": str(part.source)}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for n in names:
                f.write(part.tensors[n].contiguous().numpy().data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_cache(target: Path, key: str, source: Path) -> GGUFModel | None:
    """The cached model, or None if it is missing, stale or corrupt (checked: format, key, names, checksum)."""
    import json

    from safetensors import safe_open
    from tokenizers import Tokenizer

    if not target.is_file():
        return None
    try:
        with safe_open(str(target), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
                return None
            tensors = {n: f.get_tensor(n) for n in f.keys()}
        total = 0
        for t in tensors.values():
            if t.dtype != torch.float32:
                return None
            total = (total + _checksum(t)) % (1 << 64)
        if str(total) != meta.get("checksum"):
            return None
        config = json.loads(meta["config"])
        part = GGUFModel(config=config, tensors=tensors,
                         tokenizer=Tokenizer.from_str(meta["tokenizer"]) if meta["tokenizer"] else None,
                         chat_template=json.loads(meta["chat_template"]),
                         special_ids=json.loads(meta["special_ids"]), source=source, from_cache=True)
    except Exception:  # a corrupt cache is rebuilt, whatever its damage
        return None
    os.utime(target)  # least recently used go first
    return part


def _prune(directory: Path, keep: Path) -> None:
    files = sorted(directory.glob("*.safetensors"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [p for p in files if p != keep][CACHE_ENTRIES - 1 :]:
        old.unlink(missing_ok=True)


def read_model(path: str | os.PathLike, cache: bool = True) -> GGUFModel:
    """Config, HF-named float32 tensors, tokenizer, chat template and special ids of a GGUF (ARCHITECTURES).

    With `cache`, the dequantized tensors (and the tokenizer) are kept as a safetensors file under
    `cache_dir()`, keyed by the GGUF's size, mtime and header hash and checked on every read, so the
    next load skips parsing and dequantizing; a stale or corrupt copy is rebuilt.
    """
    from model.loaders.bpe import tokenizer_from_gguf

    path = Path(path).resolve()
    target = None
    if cache:
        try:
            key = cache_key(path)
        except OSError as e:
            raise GGUFError(f"Cannot read {path}: {e.strerror or e}.") from e
        target = cache_dir() / f"{path.stem[:80]}-{key[:20]}.safetensors"
        part = _read_cache(target, key, path)
        if part is not None:
            return part
    g = read_gguf(path)
    try:
        config = hf_config(g)
        from model.loaders.hf import config_from_hf

        config_from_hf(config)  # the lab's size limits, and the float32 model must fit in memory: before dequantizing
        # a file converted without its vocabulary (tokenizer.ggml.model absent or "none") opens on token ids
        no_vocab = g.metadata.get("tokenizer.ggml.model") in (None, "none")
        tokenizer = None if no_vocab else tokenizer_from_gguf(g.metadata, path.name)
        if tokenizer is not None and tokenizer.get_vocab_size() != config["vocab_size"]:
            raise GGUFError(f"{path.name}: the tokenizer has {tokenizer.get_vocab_size():,} tokens, "
                            f"the embedding {config['vocab_size']:,} rows.")
        template = g.metadata.get("tokenizer.chat_template")
        part = GGUFModel(config=config, tensors=dict(hf_tensors(g, config)), tokenizer=tokenizer,
                         chat_template=template if isinstance(template, str) else None,
                         special_ids=special_ids(g.metadata, config["vocab_size"]), source=path)
    finally:
        g.data = None  # drop the memory map: the file's pages leave this process
    if target is not None:
        try:
            _write_cache(target, part, key)
            _prune(target.parent, target)
        except OSError:
            pass  # a read-only or full cache dir only costs the next load its dequantization
    return part


def load_gguf(path: str | os.PathLike, name: str | None = None, cache: bool = True):
    """A GGUF of one of ARCHITECTURES -> LanguageModel (DecoderLM inside, float32), via `lm_from_hf`."""
    from model.loaders.hf import lm_from_hf
    from model.loaders.lm import STOP_GGUF_EOM, STOP_GGUF_EOS, STOP_GGUF_EOT, LanguageModel

    part = read_model(path, cache=cache)
    model = lm_from_hf(part.config, part.tensors)
    part.tensors.clear()  # the model holds them now (assigned, not copied)
    ids = part.special_ids
    if "eot" not in ids:  # a cache written before eot/eom were kept: the file's header says (a second's read)
        ids = special_ids(read_gguf(part.source).metadata, model.cfg.vocab_size)
    # the ids that end a generation: the file's own end tokens (LanguageModel.stop_rule adds a chat's turn end)
    stops = {}
    for key, source in (("eos", STOP_GGUF_EOS), ("eot", STOP_GGUF_EOT), ("eom", STOP_GGUF_EOM)):
        if ids.get(key) is not None:
            stops.setdefault(ids[key], source)
    tok = part.tokenizer
    special = {} if tok is None else {f"{k}_token": tok.id_to_token(ids[k]) for k in ("bos", "eos", "pad")
                                      if ids.get(k) is not None and ids[k] < tok.get_vocab_size()}
    return LanguageModel(model, part.tokenizer, name=name or part.source.stem, chat_template=part.chat_template,
                         stop_ids=list(stops), stop_sources=stops, source=part.source, special_tokens=special)
