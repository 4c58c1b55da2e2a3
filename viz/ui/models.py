"""Models and traces for the pages: shipped checkpoints and real models loaded once and shared, traces cached.

State rules (Streamlit serves many sessions from threads of one process):
- shipped checkpoints and their traces live in bounded `st.cache_resource` caches: shared,
  read-only (a `Trace` is immutable; nothing here writes into a model);
- a model trained in this session lives in `st.session_state["session_models"][name]` (the
  training page puts it there); its traces are cached in the session, never process-wide.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict

import streamlit as st

from model.core import recorder
from viz.i18n import t
from viz.ui import lm_models
from viz.ui.heap import freeze_after_load

TRACE_CACHE_ENTRIES = 16  # a full trace of a 256-token input is ~20 MB: bound the shared cache
LM_TRACE_ENTRIES = 6  # a real LM's full trace is far bigger (SmolLM2, 64 tokens: ~90 MB)
LM_TRACE_BYTES = 1024 * 2**20  # ... and together at most this (a full SmolLM2 trace at 276 tokens: ~500 MB)
SESSION_TRACES = 4  # traces of session-trained models kept per session
SESSION_MODELS = "session_models"  # st.session_state key: name -> Checkpoint trained in this session


EXTRA_ENV = "ATTENTION_LAB_CHECKPOINTS"  # os.pathsep-separated checkpoint dirs to offer too


def _checkpoint_api():
    try:
        from model import list_checkpoints, load_checkpoint
    except ImportError:  # the package root may not re-export them
        from model.toy.checkpoint import list_checkpoints, load_checkpoint
    return list_checkpoints, load_checkpoint


def session_models() -> dict:
    """name -> Checkpoint trained in this session (see the training page); {} outside a session."""
    try:
        return st.session_state.get(SESSION_MODELS) or {}
    except Exception:  # no Streamlit session (bare scripts)
        return {}


def add_session_model(name: str, model) -> None:
    """Offer `model` in the sidebar's model list, on every page, for the rest of this session: a toy Checkpoint
    (Training, live) or a `lm_models.RealModel` (a /learn checkpoint: viz/ui/learn_run.py)."""
    models = st.session_state.setdefault(SESSION_MODELS, {})
    if models.get(name) is not model:
        models[name] = model


def is_real_name(name: str) -> bool:
    """Whether model `name` is a real model (read as a language model or an encoder), not a toy translator: SmolLM2,
    MiniLM, a server model, or a language model this session added (a /learn checkpoint)."""
    own = session_models().get(name)
    if own is not None:
        return isinstance(own, lm_models.RealModel)
    return lm_models.is_real(name)


def checkpoint_names() -> list[str]:
    """Shipped checkpoint names, any directories listed in $ATTENTION_LAB_CHECKPOINTS, then the
    models trained in this session."""
    list_checkpoints, _ = _checkpoint_api()
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p.strip()]
    names = list(list_checkpoints()) + extra
    names += [n for n in lm_models.names() if n not in names]  # SmolLM2, MiniLM, the server's --model ones
    return names + [n for n in session_models() if n not in names]


_FAILED: dict[str, str] = {}  # server model label -> why it last failed to load (a process-wide fact, like the list)
_FAILED_LOCK = threading.Lock()


def load_failed(name: str) -> bool:
    """Whether the server model `name` failed the last time it was loaded (the model list says it cannot open)."""
    with _FAILED_LOCK:
        return name in _FAILED


def server_file_exists(name: str) -> bool:
    """Whether a server model's file or directory is there (a label for a path that is gone says so, unloaded)."""
    where = lm_models.server_models().get(name)
    return where is None or os.path.exists(where)


@st.cache_resource(show_spinner=False, max_entries=8)
def _load_shared(name: str):
    if lm_models.is_real(name):  # weights shared through model.load_model's own per-process cache
        try:
            rm = lm_models.load(name)
        except KeyError as e:
            raise ValueError(t("This server offers no model “{name}”.", name=name)) from e
        except ValueError as e:  # not cached by st.cache_resource: the next pick tries again (a file put back)
            with _FAILED_LOCK:
                _FAILED[name] = str(e)
            raise
        with _FAILED_LOCK:
            _FAILED.pop(name, None)
        freeze_after_load(name)  # its modules and tokenizer live as long as the server: out of the GC's walks
        return rm
    _, load_checkpoint = _checkpoint_api()
    ckpt = load_checkpoint(name)
    ckpt.model.eval()
    return ckpt


# called with a model's name before a session waits for its shared load; the warm-up registers itself here (its
# module imports this one: an import the other way would be a circle)
BEFORE_SHARED_LOAD: list = []


def load_ckpt(name: str):
    """The checkpoint `name`: a model trained in this session, else a shipped name or directory,
    loaded once and shared read-only by all sessions (never train or mutate it)."""
    own = session_models().get(name)
    if own is not None:
        return own
    for hook in BEFORE_SHARED_LOAD:  # the warm-up's boost: if it is loading `name` at its low priority, the load
        hook(name)  # runs at ours from now on
    return _load_shared(name)


@st.cache_resource(show_spinner=False, max_entries=TRACE_CACHE_ENTRIES, ttl=3600)
def _cached_trace(name: str, text: str, target: str | None):
    return _load_shared(name).trace(text, target=target)


def _session_trace(name: str, text: str, target: str | None):
    """A session model's trace, in a small per-session LRU keyed by the model object too (a model
    retrained under the same name must not show the old one's trace)."""
    ckpt = session_models()[name]
    cache = st.session_state.setdefault("_al_session_traces", OrderedDict())
    key = (id(ckpt), name, text, target)
    if key not in cache:
        cache[key] = ckpt.trace(text, target=target)
        while len(cache) > SESSION_TRACES:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return cache[key]


class BoundedTraces:
    """The shared cache of real LMs' traces, bounded in BYTES as well as entries (issue 24 §6's soak: six full
    SmolLM2 traces of 276-token prompts held ~3 GB after the class had gone). Least recently used out first;
    the newest always stays. Single flight: a second session asking for a trace being computed waits for it.

    Entries unused for `idle_s` seconds go too (a sweeper thread looks every minute at most): the soak's class
    left its five 2,048-token traces behind, memory after ÷ before 1.91. A pause in a lesson is shorter."""

    def __init__(self, max_entries: int, max_bytes: int, make=None, idle_s: float | None = None,
                 clock=time.monotonic):
        from model.analysis.shared import SharedResults

        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.idle_s = trace_idle_s() if idle_s is None else idle_s
        self.clock = clock
        # make(*key) -> (logits, trace); by default a real model's trace (name, text, chat)
        self.make = make or (lambda name, text, chat: _load_shared(name).trace(text, chat=chat))
        self._flight = SharedResults(max_entries=1)  # single flight only; the entries live below
        self._done: OrderedDict = OrderedDict()  # key -> ((logits, trace), nbytes, last use)
        self._lock = threading.Lock()

    def __call__(self, *key):
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                out, size, _ = self._done[key]
                self._done[key] = (out, size, self.clock())
                return out
        out = self._flight.get(key, lambda: self.make(*key))
        first = out[0] if isinstance(out[0], list | tuple) else [out[0]]  # logits, or MiniLM's hidden states per layer
        size = int(out[1].nbytes()) + sum(x.numel() * x.element_size() for x in first)
        with self._lock:
            self._done[key] = (out, size, self.clock())
            self._done.move_to_end(key)
            while len(self._done) > 1 and (len(self._done) > self.max_entries or
                                           sum(e[1] for e in self._done.values()) > self.max_bytes):
                self._done.popitem(last=False)
        _sweep_every(self)
        return out  # (_flight keeps the newest result only: the one _done never evicts, no extra memory)

    def sweep(self) -> int:
        """Drop the entries unused for idle_s seconds (the newest too: the class has gone); how many went."""
        now = self.clock()
        with self._lock:
            idle = [k for k, (_, _, last) in self._done.items() if now - last > self.idle_s]
            for k in idle:
                del self._done[k]
            if idle and not self._done:
                self._flight.clear()  # it held the newest result
        return len(idle)

    def replace(self, key, out) -> None:
        """Put `out` in place of key's entry (the same tensors under a richer meta: same size), if still held."""
        with self._lock:
            if key in self._done:
                _, size, last = self._done[key]
                self._done[key] = (out, size, last)

    def nbytes(self) -> int:
        with self._lock:
            return sum(e[1] for e in self._done.values())

    def clear(self) -> None:
        with self._lock:
            self._done.clear()
        self._flight.clear()


def per_trace(cache: OrderedDict, lock, size: int, key, trace, make):
    """`make()`, kept in the bounded LRU `cache` (at most `size` entries, guarded by `lock`) under `key` for that
    very trace object: the entry holds the trace weakly (it never keeps one alive), and a new trace that reuses a
    freed one's id never meets the old trace's result."""
    with lock:
        hit = cache.get(key)
    if hit is None or hit[0]() is not trace:
        hit = (weakref.ref(trace), make())
    with lock:
        cache[key] = hit
        cache.move_to_end(key)
        while len(cache) > size:
            cache.popitem(last=False)
    return hit[1]


def trace_idle_s() -> float:
    """Seconds a cached long-model trace may go unused: $ATTENTION_LAB_TRACE_IDLE_S, else 20 minutes."""
    try:
        return max(1.0, float(os.environ.get("ATTENTION_LAB_TRACE_IDLE_S", "1200")))
    except ValueError:
        return 1200.0


_swept: weakref.WeakSet = weakref.WeakSet()  # every BoundedTraces that held an entry
_sweeper: list[threading.Thread] = []  # the one sweeper thread, once started
_swept_lock = threading.Lock()


def sweep_all() -> int:
    """Sweep every cache once; when traces went, give their memory back to the OS. Freed, a trace's tensors
    (4.7 MB each at 2,048 tokens) stay in glibc's heap for reuse: the soak's idle drop was 240 MB of ~1.2 GB
    until malloc_trim ran here too."""
    n = sum(c.sweep() for c in list(_swept))
    if n:
        from viz.ui.heap import return_freed_memory

        return_freed_memory()
    return n


def _sweep_every(cache: BoundedTraces) -> None:
    """Start (once per process) the daemon thread that sweeps every BoundedTraces that ever held an entry."""
    with _swept_lock:
        _swept.add(cache)
        if _sweeper:
            return

        def loop():
            while True:
                time.sleep(max(1.0, min(60.0, min((c.idle_s for c in list(_swept)), default=60.0) / 4)))
                sweep_all()

        _sweeper.append(threading.Thread(target=loop, name="attention-lab-trace-sweeper", daemon=True))
        _sweeper[0].start()


_cached_lm_trace = BoundedTraces(LM_TRACE_ENTRIES, LM_TRACE_BYTES)


# ---------------------------------------------------------------- long prompts: one lazy trace for every page

LONG_BUDGET = 2**30  # a lazy trace of q, k, v only, at most this: SmolLM2 at 8,192 tokens is 0.92 GiB
LONG_TRACES = 8  # lazy traces kept for all sessions, at most this many and ...
LONG_TRACES_BYTES = 2048 * 2**20  # ... this many bytes together: a class's five 2,048-token prompts with each
                                  # layer's output (~380 MB each); one 8,192-token prompt's q, k, v: 0.92 GiB
_NEXT_LOCK = threading.Lock()  # one unembedding of every position at a time (RealModel.with_next_tokens)


def _make_long_trace(name: str, text: str, chat: bool, keep: int | None, layers: bool):
    """The lazy trace of `text` (its last `keep` tokens) that every page of a long prompt reads. With `layers`
    (up to the lazy limit, lm_models.LAZY_BUDGET_BYTES: SmolLM2 ~2,700 tokens) it keeps each layer's output too, so
    Inside a layer, the Tokens page and the rest run one layer again from it, not a forward of their own (issue 31
    §2: 6.6-15.3 s after the Attention page); without, q, k and v only (what the Attention page and /llm read)."""
    rm = _load_shared(name)
    lm = rm.obj
    ids = lm.encode(text, chat=chat, keep_last=keep)
    T = ids.shape[1]
    if layers:  # each position's next token is left to a page that shows it (_long_for_pages)
        return rm.trace(text if keep is None else ids, chat=chat and keep is None, next_tokens=False, lazy=True)
    with lm_models.LONG_RUNS:  # one long forward at a time on this server (clicks do not queue behind five)
        logits, trace = lm.run_with_trace(ids, lazy=True, fast=T > lm_models.EXACT_UP_TO, budget_bytes=LONG_BUDGET,
                                          last_only=True)
    meta = trace.meta
    meta["checkpoint"] = name
    meta["tgt_pieces"] = lm.tokens(ids[0])
    meta["tgt_tokens"] = rm.readable(meta["tgt_pieces"])
    return logits, trace.with_meta(meta)


# Bounded in bytes, not entries (a class's five 2,048-token prompts: 1.9 GB; one 8,192-token prompt: 0.9 GiB):
# with two entries, the soak's five long sessions evicted each other and a head switch ran the forward again.
_LONG_TRACES = BoundedTraces(LONG_TRACES, LONG_TRACES_BYTES, make=_make_long_trace)


def long_lm_trace(name: str, text: str, chat: bool = False, keep: int | None = None, n_tokens: int | None = None):
    """The lazy trace of a long prompt (see _make_long_trace), shared by every session and page (read-only).
    n_tokens: the prompt's length (after `keep`), when the caller has it (else the text is tokenized here)."""
    rm = _load_shared(name)
    T = n_tokens or rm.obj.encode(text, chat=chat, keep_last=keep).shape[1]
    # whether it keeps each layer's output is part of the key: a server whose budget changed never reads the other kind
    return _LONG_TRACES(name, text, bool(chat), keep, rm.lazy_layers_fit(T))[1]


def _long_for_pages(name: str, text: str, chat: bool, next_tokens: bool):
    """get_trace of a prompt too long for a full trace: the shared long trace, with each position's next token
    in its meta when the page asks (computed once per prompt: the cache then holds the trace with them)."""
    key = (name, text, chat, None, True)
    logits, trace = _LONG_TRACES(*key)
    if not next_tokens or trace.meta_item("next_tokens") is not None:
        return trace
    with _NEXT_LOCK:
        logits, trace = _LONG_TRACES(*key)  # another session may have added them meanwhile
        if trace.meta_item("next_tokens") is None:
            trace = _load_shared(name).with_next_tokens(trace)
            _LONG_TRACES.replace(key, (logits, trace))
    return trace


def _long_prompt(name: str, text: str, chat: bool) -> bool:
    """Whether real model `name`'s trace of `text` is the shared long one: too long for a full trace, within
    the lazy limit of one with each layer's output. (Beyond it, RealModel.trace says the limit.)"""
    rm = _load_shared(name)
    if getattr(rm, "family", None) != "decoder_lm":
        return False
    T = rm.obj.encode(text, chat=chat).shape[1]  # over the context length: ContextLengthError, as the trace says
    return rm.obj.trace_bytes(T) > recorder.DEFAULT_BUDGET_BYTES and rm.lazy_layers_fit(T)  # (read now: tests lower it)


def get_trace(name: str, text: str, target: str | None = None, chat: bool = False, next_tokens: bool = True):
    """Full trace of checkpoint `name` on `text` (target None = the model's own greedy output; a real
    model's `chat=True` wraps the text in its chat template).

    Cached per (checkpoint, text, target): the same input always gives the same read-only trace. A real
    language model's prompt too long for a full trace gets the lazy trace every page shares (long_lm_trace);
    next_tokens=False: a page that shows no "input → predicted" labels spares that trace's unembedding of every
    position (meta["next_tokens"] may then be missing).
    Raises ValueError (and subclasses) for input the model cannot take.
    """
    if lm_models.is_real(name) and name not in session_models():
        if _long_prompt(name, text, bool(chat)):
            return _long_for_pages(name, text, bool(chat), next_tokens)
        return _cached_lm_trace(name, text, bool(chat))[1]
    if name in session_models():
        return _session_trace(name, text, target or None)[1]
    return _cached_trace(name, text, target or None)[1]


# see sidebar.require; "via_transformers": a model of another type opened through transformers' own modules
# (model/loaders/adapter.py): attention weights, the residual stream after each layer and logits only
CAPABILITIES = ("toy", "encoder", "decoder", "cross_attention", "lm", "via_transformers")


def capabilities(name: str) -> set[str]:
    """What model `name` has, from its own description (describe()), never from its name."""
    ckpt = load_ckpt(name)
    if not isinstance(ckpt, lm_models.RealModel):
        return {"toy", "encoder", "decoder", "cross_attention"}
    desc = ckpt.describe()
    if desc.get("family") == "decoder_lm_adapter":  # not the lab's family: no page that needs "lm" reads it
        return {"via_transformers"}
    kinds = {a["kind"] for a in desc.get("attention", {}).values()}
    out = set(desc.get("stacks", {})) & {"encoder", "decoder"}
    if "cross" in kinds:
        out.add("cross_attention")
    if desc.get("family") == "decoder_lm":
        out.add("lm")
    return out


def is_real_model(sel) -> bool:
    """Whether the selection is a real model (SmolLM2, MiniLM, a server model, a /learn checkpoint added in this
    session), not a toy translator: `is_real_name`."""
    return sel is not None and is_real_name(sel.name)
