"""Checkpoints: a trained model with its tokenizers, training log, film strip and metadata.

A checkpoint is a directory of safetensors + JSON files only (a pickle can run code when
loaded, so none is ever read):

    config.json          TransformerConfig
    model.safetensors    weights (metadata format=attention-lab-checkpoint)
    src_tokenizer.json   tgt_tokenizer.json   (Hugging Face tokenizer.json, see model.tokenizer)
    meta.json            task, steps, held-out accuracy, the training command, wall time, versions
    log.json             per-step training curves: step, loss, lr, acc
    film.safetensors     attention of a fixed probe example every K training steps

Shipped checkpoints live in model/checkpoints/<name>/ (package data).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from model.core.config import TransformerConfig
from model.core.trace import Trace
from model.families.transformer import Transformer
from model.toy import decode as dec
from model.toy.tokenizer import Tokenizer

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"
FORMAT, FILM_FORMAT, FORMAT_VERSION = "attention-lab-checkpoint", "attention-lab-film", "1"
REQUIRED = ("config.json", "model.safetensors", "src_tokenizer.json", "tgt_tokenizer.json", "meta.json")
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
LOG_KEYS = ("step", "loss", "lr", "acc")

DECODE_OPTIONS = {
    "greedy": {"max_new_tokens", "n_top", "stop_loops"},
    "beam": {"beam_width", "length_penalty", "max_new_tokens", "n_top", "stop_loops"},
    "sample": {"temperature", "top_k", "top_p", "seed", "max_new_tokens", "n_top", "stop_loops"},
}


def sampling_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> torch.Tensor:
    """The distribution `translate(..., "sample", ...)` draws a step's token from: softmax(logits / T)
    after top-k and top-p (nucleus) filtering. `Step.logits` are raw, so with a Translation's
    `options` this reproduces `Step.prob` exactly; softmax(logits) is the model's own distribution."""
    return dec._filter(logits, temperature, top_k, top_p)


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, foreign, or inconsistent with itself."""


def list_checkpoints(root: str | Path = CHECKPOINT_DIR) -> list[str]:
    """Names of the shipped checkpoints (directories holding a meta.json)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "meta.json").is_file())


def load_checkpoint(name_or_path: str | Path) -> Checkpoint:
    """A shipped checkpoint by name ("dates"), a checkpoint directory by path, or a single-file
    checkpoint (`save_checkpoint_file`: what the Training page downloads)."""
    if _is_single_file(name_or_path):
        return load_checkpoint_file(name_or_path)
    return Checkpoint.load(name_or_path)


class Checkpoint:
    def __init__(
        self,
        model: Transformer,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        meta: dict | None = None,
        log: dict | None = None,
        film: list[tuple[int, Trace]] | None = None,
        name: str | None = None,
        path: Path | None = None,
    ):
        _check_vocab(model.cfg, src_tokenizer, tgt_tokenizer, where="")
        self.model = model.eval()
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.meta = dict(meta or {})
        self.log = log if log is not None else {k: [] for k in LOG_KEYS}
        self.name = name or self.meta.get("name") or self.meta.get("task") or "checkpoint"
        self.path = path
        self._film = film  # None: read lazily from path

    def __repr__(self) -> str:
        acc = self.meta.get("accuracy")
        acc = f", accuracy={acc:.1%}" if isinstance(acc, float) else ""
        return f"Checkpoint({self.name!r}, {self.model.num_parameters():,} parameters{acc})"

    @property
    def cfg(self) -> TransformerConfig:
        return self.model.cfg

    @property
    def example(self) -> str:
        """A good default input for the UI."""
        return self.meta.get("example") or self.meta.get("probe", {}).get("source", "")

    # ------------------------------------------------------------------ inference

    def encode_source(self, text: str) -> torch.Tensor:
        """(1, S) source ids. Outer whitespace is stripped; characters or words outside the
        vocabulary become [UNK]; text over the model's limit is refused, never truncated."""
        if not isinstance(text, str):
            raise TypeError(f"expected the input as a str, got {type(text).__name__}")
        text = text.strip()
        if not text:
            raise ValueError("the input is empty (or only whitespace): type some text to translate")
        ids = self.src_tokenizer.encode(text)
        if not ids:
            raise ValueError(f"the input {text!r} has no tokens for this model's tokenizer: type some text")
        eos = self.src_eos
        if len(ids) + eos > self.cfg.max_len:
            raise ValueError(
                f"the input is {len(ids)} tokens long; this model's limit is {self.cfg.max_len - eos} "
                f"tokens{' (plus [EOS])' if eos else ''}. Shorten it: it is never silently truncated."
            )
        return torch.tensor([ids + [self.src_tokenizer.eos_id] * eos], dtype=torch.long)

    @property
    def src_eos(self) -> bool:
        """Whether the source ends with [EOS] (an anchor for "how far from the end am I")."""
        return bool(self.meta.get("src_eos", False))

    @property
    def max_new_tokens(self) -> int:
        """The generation limit of translate() and trace(), one for every page: [BOS] + the output
        must fit the model's max_len positions, so a teacher-forced pass over any output it
        generates is possible. An output that reaches it did not end with [EOS] (a model that
        never stops, e.g. on inputs longer than it was trained on): Translation.finished and
        trace meta["finished"] say so."""
        return self.cfg.max_len - 1

    def src_tokens(self, text: str) -> list[str]:
        return self.src_tokenizer.tokens(self.encode_source(text)[0].tolist())

    def _decode_kw(self) -> dict:
        t = self.tgt_tokenizer
        return {"id_to_token": t.id_to_token, "detok": t.decode}

    def translate(self, text: str, strategy: str = "greedy", hooks=None, **options) -> dec.Translation:
        """Decode `text` step by step with "greedy", "beam" (beam_width, length_penalty) or
        "sample" (temperature, top_k, top_p, seed); every step is recorded (see model.decode).
        `hooks` ({glob: fn(tensor, name)}, see Transformer.run_with_trace) act in every step."""
        if strategy not in DECODE_OPTIONS:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {list(DECODE_OPTIONS)}")
        unknown = set(options) - DECODE_OPTIONS[strategy]
        if unknown:
            raise TypeError(
                f"unknown option(s) {sorted(unknown)} for strategy {strategy!r}; "
                f"valid: {sorted(DECODE_OPTIONS[strategy])}"
            )
        src = self.encode_source(text)
        t = self.tgt_tokenizer
        asked = options.get("max_new_tokens")
        if asked is None or (isinstance(asked, int) and asked > self.max_new_tokens):
            options["max_new_tokens"] = self.max_new_tokens
        if strategy == "beam" and "length_penalty" in options:
            options["length_penalty_alpha"] = options.pop("length_penalty")
        src_tokens = self.src_tokenizer.tokens(src[0].tolist())  # the loop guard compares with the source
        kw = {**options, **self._decode_kw(), "src_tokens": src_tokens}
        with self.model.hooks(hooks):
            if strategy == "beam":
                out = dec.beam_search(self.model, src, t.bos_id, t.eos_id, **kw)
            else:
                out = dec.generate(self.model, src, t.bos_id, t.eos_id, strategy, **kw)
        out.src_tokens = src_tokens
        return out

    def _greedy_ids(self, src: torch.Tensor) -> list[list[int]]:
        """Batched greedy outputs (no [EOS]) under the shared length limit and the loop guard."""
        t = self.tgt_tokenizer
        rows = [self.src_tokenizer.tokens(r.tolist()) for r in src]
        return dec.greedy_batch(self.model, src, t.bos_id, t.eos_id, self.max_new_tokens,
                                src_tokens=rows, id_to_token=t.id_to_token)

    def translate_batch(self, texts: list[str], batch_size: int = 250) -> list[str]:
        """Greedy outputs of many inputs, batched and without records (for evaluation)."""
        outs: list[str] = []
        t = self.tgt_tokenizer
        for i in range(0, len(texts), batch_size):
            rows = [self.encode_source(x)[0] for x in texts[i : i + batch_size]]
            src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=self.cfg.pad_id)
            outs += [t.decode(ids) for ids in self._greedy_ids(src)]
        return outs

    def evaluate(self, pairs: list[tuple[str, str]], batch_size: int = 250) -> float:
        """Exact-match accuracy of greedy decoding over (source, target) pairs."""
        if not pairs:
            return float("nan")
        outs = self.translate_batch([s for s, _ in pairs], batch_size)
        return sum(o == _canon(self.tgt_tokenizer, y) for o, (_, y) in zip(outs, pairs, strict=True)) / len(pairs)

    def target_ids(self, target: str) -> list[int]:
        ids = self.tgt_tokenizer.encode(target)
        if len(ids) + 1 > self.cfg.max_len:
            raise ValueError(
                f"the target is {len(ids)} tokens long; with [BOS] this model's limit is {self.cfg.max_len - 1} tokens"
            )
        return ids

    @torch.no_grad()
    def trace(self, text: str, target: str | None = None, names=None, hooks=None) -> tuple[torch.Tensor, Trace]:
        """Teacher-forced pass: decoder input [BOS] + target (None: the greedy translation, decoded
        under `hooks` too, so an intervention's trace shows the output it causes).

        Returns (logits [1, T, V], Trace); Trace.meta has src_tokens, tgt_tokens (decoder input),
        next_tokens (what each position should predict: target + [EOS]), checkpoint, text, target,
        generated (target None), finished (False: the greedy output reached `max_new_tokens`
        without [EOS]) and max_new_tokens.
        """
        src = self.encode_source(text)
        t = self.tgt_tokenizer
        generated = target is None
        if generated:
            with self.model.hooks(hooks):
                ids = self._greedy_ids(src)[0]
            target = t.decode(ids)
            looped = _loop_of(t.tokens(ids), self.src_tokenizer.tokens(src[0].tolist()))
            # greedy_batch cuts [EOS]: a full-length row, or one the loop guard stopped, has none
            finished = len(ids) < self.max_new_tokens and looped is None
        else:
            ids = self.target_ids(target)
            finished, looped = True, None
        tgt = torch.tensor([[t.bos_id, *ids]])
        meta = {
            "src_tokens": self.src_tokenizer.tokens(src[0].tolist()),
            "tgt_tokens": t.tokens(tgt[0].tolist()),
            "next_tokens": t.tokens([*ids, t.eos_id]),
            "checkpoint": self.name,
            "text": text.strip(),
            "target": target,
            "generated": generated,
            "finished": finished,
            "max_new_tokens": self.max_new_tokens,
        }
        if generated and looped is not None:
            meta["looped"] = {"ngram": list(looped.ngram), "repeats": looped.repeats, "at_step": looped.at_step}
        return self.model.run_with_trace(src, tgt, names=names, meta=meta, hooks=hooks)

    # ------------------------------------------------------------------ film strip

    def film(self) -> list[tuple[int, Trace]]:
        """The training film strip: (step, Trace of the probe example's attention) every K steps."""
        if self._film is None:
            self._film = _load_film(self.path / "film.safetensors") if self.path else []
        return list(self._film)

    # ------------------------------------------------------------------ save / load

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        _write_json(path / "config.json", self.cfg.to_dict())
        tensors, tied = _untie(self.model.state_dict())
        save_file(
            tensors,
            str(path / "model.safetensors"),
            metadata={"format": FORMAT, "version": FORMAT_VERSION, "tied": json.dumps(tied)},
        )
        self.src_tokenizer.save(path / "src_tokenizer.json")
        self.tgt_tokenizer.save(path / "tgt_tokenizer.json")
        _write_json(path / "meta.json", self.meta)
        _write_json(path / "log.json", self.log, indent=None)  # long lists: one line
        film = self.film()
        if film:
            _save_film(film, path / "film.safetensors")
        for f in (*REQUIRED, "log.json", "film.safetensors"):  # safetensors writes 0600; package data
            if (path / f).is_file():  # must be world-readable
                (path / f).chmod(0o644)
        self.path = path
        return path

    @classmethod
    def load(cls, name_or_path: str | Path) -> Checkpoint:
        path = _resolve(name_or_path)
        for f in REQUIRED:
            if not (path / f).is_file():
                pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
                hint = (
                    f" It holds {pickles}: pickle files are never loaded (they can run code); "
                    f"Attention Lab checkpoints are safetensors + JSON only."
                    if pickles
                    else ""
                )
                raise CheckpointError(
                    f"{path}: not an Attention Lab checkpoint, {f} is missing.{hint} "
                    f"A checkpoint directory holds {', '.join(REQUIRED)}."
                )
        try:
            cfg = TransformerConfig.from_dict(_read_json(path / "config.json"))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{path / 'config.json'}: invalid model config: {e}") from None
        if cfg.encoder_only:
            raise CheckpointError(f"{path / 'config.json'}: an encoder-only config; a checkpoint is a translator")
        tokenizers = []
        for side in ("src", "tgt"):
            try:
                tokenizers.append(Tokenizer.load(path / f"{side}_tokenizer.json"))
            except ValueError as e:
                raise CheckpointError(f"{path / f'{side}_tokenizer.json'}: {e}") from None
        _check_vocab(cfg, *tokenizers, where=f"{path}: ")
        model = Transformer(cfg)
        _load_weights(model, path / "model.safetensors")
        meta = _read_json(path / "meta.json")
        log = _read_json(path / "log.json") if (path / "log.json").is_file() else None
        name = path.name if path.parent == CHECKPOINT_DIR else meta.get("name") or path.name
        return cls(model, *tokenizers, meta=meta, log=log, name=name, path=path)


# ---------------------------------------------------------------------- helpers


def _loop_of(out_tokens: list[str], src_tokens: list[str]) -> dec.Loop | None:
    """The loop the guard stopped a greedy output at (it stops at the first token that completes one)."""
    guard = dec.LoopGuard(src_tokens)
    found = [guard.push(tok) for tok in out_tokens]
    return found[-1] if found and found[-1] is not None else None


def _canon(tok: Tokenizer, text: str) -> str:
    """The target as the tokenizer will print it (WordPiece lowercases and respaces)."""
    return tok.decode(tok.encode(text))


def _resolve(name_or_path: str | Path) -> Path:
    available = list_checkpoints()
    if isinstance(name_or_path, str) and name_or_path in available:
        return CHECKPOINT_DIR / name_or_path
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix in PICKLE_SUFFIXES:
            raise CheckpointError(
                f"{path}: refusing to load a pickle file (it can run code); Attention Lab "
                f"checkpoints are directories of safetensors + JSON files"
            )
        raise CheckpointError(f"{path} is a file; a checkpoint is a directory ({', '.join(REQUIRED)})")
    looks_like_name = isinstance(name_or_path, str) and os.sep not in name_or_path
    what = "unknown checkpoint name" if looks_like_name else "no checkpoint directory at"
    raise CheckpointError(
        f"{what} {str(name_or_path)!r}; available checkpoints: {available or 'none shipped'} "
        f"(or pass the path of a saved checkpoint directory)"
    )


def _check_vocab(cfg: TransformerConfig, src: Tokenizer, tgt: Tokenizer, where: str) -> None:
    for side, tok, n in (("src", src, cfg.src_vocab_size), ("tgt", tgt, cfg.tgt_vocab_size)):
        if tok.vocab_size != n:
            kind = "source" if side == "src" else "target"
            raise CheckpointError(
                f"{where}{side}_tokenizer.json has {tok.vocab_size} tokens but the model's {kind} embedding "
                f"has {n} rows ({side}_vocab_size): the tokenizer does not belong to this model"
            )
        if tok.pad_id != cfg.pad_id:
            raise CheckpointError(
                f"{where}{side}_tokenizer.json pads with id {tok.pad_id}, the model with {cfg.pad_id}"
            )


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt, not valid JSON ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from None


def _write_json(path: Path, obj, indent: int | None = 1) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def _untie(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors refuses shared storage: keep one copy of tied weights, remember the aliases."""
    seen: dict[tuple, str] = {}
    tensors, tied = {}, {}
    for k, v in state.items():
        key = (v.data_ptr(), tuple(v.shape), v.dtype)
        if key in seen:
            tied[k] = seen[key]
        else:
            seen[key] = k
            tensors[k] = v.contiguous()
    return tensors, tied


def _load_weights(model: Transformer, path: Path) -> None:
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != FORMAT:
                raise CheckpointError(
                    f"{path}: a safetensors file but not Attention Lab weights (no "
                    f"format={FORMAT!r} in its metadata; found {header.get('format')!r})"
                )
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        tied = json.loads(header.get("tied", "{}"))
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated weights file ({e})") from None
    for alias, source in tied.items():
        if source in tensors:
            tensors[alias] = tensors[source]
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"{path}: weights do not match config.json: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for k, v in expected.items():
        if tuple(tensors[k].shape) != tuple(v.shape):
            raise CheckpointError(
                f"{path}: weight {k} has shape {tuple(tensors[k].shape)}, config.json implies {tuple(v.shape)}"
            )
    model.load_state_dict(tensors)


def _save_film(film: list[tuple[int, Trace]], path: Path) -> None:
    """One file for all frames: tensors named "<step>/<capture name>", stored as float16 (half the
    size; attention weights need no more), with every frame's metadata as JSON."""
    tensors, frames = {}, []
    for step, tr in film:
        for n in tr.names():
            t = tr[n]
            tensors[f"{step}/{n}"] = (t.half() if t.is_floating_point() else t).contiguous()
        frames.append({"step": int(step), "meta": tr.meta})
    save_file(
        tensors,
        str(path),
        metadata={"format": FILM_FORMAT, "version": FORMAT_VERSION, "frames": json.dumps(frames)},
    )


def _load_film(path: Path) -> list[tuple[int, Trace]]:
    if not path.is_file():
        return []
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != FILM_FORMAT:
                raise CheckpointError(f"{path}: not an Attention Lab film strip (format={header.get('format')!r})")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        frames = json.loads(header.get("frames", "[]"))
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt film strip ({e})") from None
    out = []
    for fr in frames:
        prefix = f"{fr['step']}/"
        ts = {
            k[len(prefix) :]: v.float() if v.is_floating_point() else v
            for k, v in tensors.items()
            if k.startswith(prefix)
        }
        out.append((fr["step"], Trace(ts, fr["meta"])))
    return out


# ---------------------------------------------------------------------- one-file checkpoints
# A model trained in a browser session lives only in that session (and its server's memory): the
# Training page offers it as one download. One safetensors file: the weights (and the film strip's
# tensors under "film/<step>/..."), with every JSON file of the directory format in the header's
# metadata. Loading unpacks it into a temporary directory and reads that with `Checkpoint.load`, so
# a file gets exactly the checks a directory gets (config, tokenizers vs embeddings, weight shapes).

FILE_FORMAT = "attention-lab-checkpoint-file"
FILE_JSON = ("config.json", "src_tokenizer.json", "tgt_tokenizer.json", "meta.json", "log.json")
FILE_MAX_TENSORS = 100_000  # weights + film frames of an in-app model: a few hundred


class CheckpointFileError(CheckpointError):
    """A file that is not a one-file checkpoint. `kind`: "empty", "pickle", "zip", "foreign"
    (safetensors, but not a checkpoint), "too_many_names" or "corrupt", for a UI that words its own message."""

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind


def _is_single_file(name_or_path: str | Path) -> bool:
    if isinstance(name_or_path, str) and name_or_path in list_checkpoints():
        return False
    path = Path(name_or_path)
    return path.is_file() and path.suffix not in PICKLE_SUFFIXES  # pickles keep _resolve's refusal


def save_checkpoint_file(ckpt: Checkpoint, path: str | Path) -> Path:
    """Write `ckpt` as one .safetensors file that `load_checkpoint(path)` reads back."""
    import tempfile

    path = Path(path)
    with tempfile.TemporaryDirectory() as d:
        ckpt_dir = Path(d) / "ckpt"
        old_path = ckpt.path
        ckpt.film()  # read a lazy film before save() repoints ckpt.path
        ckpt.save(ckpt_dir)
        ckpt.path = old_path
        files = {f: (ckpt_dir / f).read_text(encoding="utf-8") for f in FILE_JSON if (ckpt_dir / f).is_file()}
        with safe_open(str(ckpt_dir / "model.safetensors"), framework="pt") as f:
            tied = (f.metadata() or {}).get("tied", "{}")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        frames = []
        if (ckpt_dir / "film.safetensors").is_file():
            with safe_open(str(ckpt_dir / "film.safetensors"), framework="pt") as f:
                frames = json.loads((f.metadata() or {}).get("frames", "[]"))
                tensors.update({f"film/{k}": f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    save_file(tensors, str(path), metadata={"format": FILE_FORMAT, "version": FORMAT_VERSION, "tied": tied,
                                            "files": json.dumps(files, ensure_ascii=False),
                                            "frames": json.dumps(frames, ensure_ascii=False)})
    return path


def load_checkpoint_file(path: str | Path, label: str | None = None) -> Checkpoint:
    """Read a one-file checkpoint. Anything else (a pickle, a zip, a trace or other safetensors, a
    forged or truncated header) is refused with a CheckpointFileError before any tensor is read.
    label: the name to use in messages (e.g. an upload's file name); default the file name."""
    import tempfile

    from model.core.trace import TraceFileError, check_safetensors_header

    path = Path(path)
    label = label or path.name
    try:
        check_safetensors_header(path, label, FILE_MAX_TENSORS, what="model")
    except TraceFileError as e:
        raise CheckpointFileError(str(e), e.kind) from None
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            if header.get("format") != FILE_FORMAT:
                raise CheckpointFileError(f"{label} is a safetensors file but not an Attention Lab model file "
                                          f"(format={header.get('format')!r})", "foreign")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        files = json.loads(header.get("files", "{}"))
        frames = json.loads(header.get("frames", "[]"))
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointFileError(f"{label}: corrupt or truncated model file ({e})") from None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise CheckpointFileError(f"{label}: its header's file table is not a JSON object of texts")
    with tempfile.TemporaryDirectory() as d:
        ckpt_dir = Path(d) / "ckpt"
        ckpt_dir.mkdir()
        for name in FILE_JSON:  # only the names this format knows: a header never chooses a path
            if name in files:
                (ckpt_dir / name).write_text(files[name], encoding="utf-8")
        weights = {k: v for k, v in tensors.items() if not k.startswith("film/")}
        save_file(weights, str(ckpt_dir / "model.safetensors"),
                  metadata={"format": FORMAT, "version": FORMAT_VERSION, "tied": header.get("tied", "{}")})
        film = {k[len("film/"):]: v for k, v in tensors.items() if k.startswith("film/")}
        if frames:
            save_file(film, str(ckpt_dir / "film.safetensors"),
                      metadata={"format": FILM_FORMAT, "version": FORMAT_VERSION, "frames": json.dumps(frames)})
        try:
            ckpt = Checkpoint.load(ckpt_dir)
            ckpt.film()  # read now: the directory goes away
        except CheckpointError as e:
            raise CheckpointFileError(f"{label}: {str(e).replace(str(ckpt_dir), 'the file')}") from None
        except (KeyError, TypeError, ValueError) as e:  # e.g. film frames that do not match their tensors
            raise CheckpointFileError(f"{label}: inconsistent model file ({type(e).__name__}: {e})") from None
    ckpt.path = None
    ckpt.name = ckpt.meta.get("name") or path.stem
    return ckpt
