"""`LanguageModel`: a loaded decoder-only model with its tokenizer, chat template and generation.

    lm = load_model("smollm2")                      # or a Hugging Face directory, or a .gguf file
    ids = lm.encode("The capital of France is")     # LongTensor [1, T]
    logits, trace = lm.run_with_trace(ids)          # trace.meta: tgt_tokens, tgt_ids, model
    out = lm.generate("The capital of France is", max_new_tokens=8)   # greedy by default
    out.text, out.tokens, out.stop_reason           # "eos" or "length"
    out.steps[0].top                                # [(token, prob)] x 10 before the choice
    out.steps[0].attention                          # [L, H, T_so_far]: the new position's attention

Stateless at inference (the KV cache lives in one `generate` call): one instance serves every
session's thread. Hooks and traces are per call (ContextVars), as everywhere in the lab.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.core import recorder
from model.core.trace import Trace, last_row, recompute_params
from model.families.lm import DecoderLM

TOP_K_RECORDED = 10
# Where an id that ends a generation comes from (LanguageModel.stop_rule): the rule is the model file's own end
# tokens (GGUF: its eos and any eot/eom it declares; a Hugging Face directory: eos_token_id in config.json and
# generation_config.json), plus, in a chat (chat=True), the token its chat template closes the assistant's turn
# with: the model was trained to write it when its answer is done. Not llama.cpp's wider list of end-like control
# texts: SmolLM2 stops at <|im_end|> (2) as transformers does, not also at <|endoftext|> (0).
STOP_GGUF_EOS = "the model file's end-of-sequence token (GGUF tokenizer.ggml.eos_token_id)"
STOP_GGUF_EOT = "the model file's end-of-turn token (GGUF tokenizer.ggml.eot_token_id)"
STOP_GGUF_EOM = "the model file's end-of-message token (GGUF tokenizer.ggml.eom_token_id)"
STOP_CONFIG = "the model's end-of-sequence token (config.json eos_token_id)"
STOP_GENERATION_CONFIG = "the model's generation config (generation_config.json eos_token_id)"
STOP_CHAT = "the chat template: it closes the assistant's turn with this token"
STOP_GIVEN = "given when the model was made (stop_ids)"


@dataclass
class Step:
    """One generated token: what was chosen, what the model offered, where the new position looked."""

    id: int
    token: str  # the raw piece (byte-level symbols like Ġ kept; the UI maps them)
    prob: float  # the model's probability of the chosen token (temperature 1, before filtering)
    top: list[tuple[str, float]]  # the model's top-10 (token, prob), temperature 1
    attention: torch.Tensor | None  # [L, H, T_so_far]: the new position's attention weights (record=True)
    position: int  # the position the token was predicted from (its index is position + 1)
    # the chosen token's probability in the distribution it was drawn from (softmax(logits / T) after top-k
    # and top-p); greedy: the model's own (= prob). What "Chosen: x (probability p)" must say at T != 1.
    sampled_prob: float | None = None
    # sampling only (T > 0): the top-10 (token, prob) of that distribution, the chosen token always among them
    drawn_top: list[tuple[str, float]] | None = None


@dataclass
class Generation:
    text: str  # the new text (end token excluded)
    tokens: list[str]  # the new pieces (end token included when it stopped there)
    ids: list[int]
    prompt_ids: list[int]
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = "length"  # "eos": an end token was produced; "length": max_new_tokens or max_len


class LanguageModel:
    def __init__(self, model: DecoderLM, tokenizer=None, name: str = "lm", chat_template: str | None = None,
                 stop_ids: Sequence[int] = (), source: Path | None = None,
                 special_tokens: Mapping[str, str] | None = None, stop_sources: Mapping[int, str] | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer, or None (ids only)
        self.name = name
        self.chat_template = chat_template
        self.stop_ids = list(dict.fromkeys(int(i) for i in stop_ids))  # always end a generation (stop_rule)
        self.stop_sources = {i: (stop_sources or {}).get(i, STOP_GIVEN) for i in self.stop_ids}
        self._turn_end: list[int] | None = None  # the chat template's end-of-turn id(s), found on first use
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.max_tokens = model.cfg.max_len

    def __repr__(self) -> str:
        c = self.model.cfg
        return (f"LanguageModel({self.name}: {c.n_layers} layers, d_model={c.d_model}, {c.n_heads} heads "
                f"({c.kv_heads} K/V), {self.model.num_parameters() / 1e6:.0f}M parameters)")

    # ---------------------------------------------------------------- tokens

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer (no tokenizer.json, or a GGUF without its vocabulary): "
                             "pass token ids instead of text")
        return self.tokenizer

    def render_chat(self, text: str) -> str:
        """The chat template applied to one user message, with the assistant's turn opened."""
        if not self.chat_template:
            raise ValueError(f"{self.name} has no chat template; use chat=False")
        from model.loaders.chat import render_chat_template  # sandboxed: whatever the template does, a sentence

        return render_chat_template(self.chat_template, [{"role": "user", "content": text}], self.name,
                                    **self.special_tokens)

    def encode(self, text: str, chat: bool = False, keep_last: int | None = None) -> torch.Tensor:
        """LongTensor [1, T]. chat=True wraps the text in the model's chat template first (its special
        tokens are in the rendered text, so no more are added). Never truncates unasked: keep_last=N
        keeps the last N tokens (the end, where the next token is predicted), as a page offers when a
        prompt is over a limit."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("the text is empty: type a prompt")
        tok = self._need_tokenizer()
        if chat:  # the template writes its own specials (Gemma's "<bos>" too): none are added
            ids = tok.encode(self.render_chat(text), add_special_tokens=False).ids
            head = ids[:1] if ids and ids[0] in self._special_ids() else []
        else:
            head = self.bos_prefix()
            ids = head + tok.encode(text, add_special_tokens=False).ids
        if len(ids) == len(head):
            raise ValueError("the text gives no tokens")
        if keep_last is not None:
            if not isinstance(keep_last, int) or keep_last < 1:
                raise ValueError(f"keep_last must be a positive integer, got {keep_last!r}")
            # the end of the text, behind the model's own BOS (a cut never drops it, nor moves it inside)
            if len(ids) > keep_last:
                body = ids[len(head):]
                ids = (head + body[len(body) - max(1, keep_last - len(head)):])[-keep_last:]
        if len(ids) > self.max_tokens:
            raise recorder.ContextLengthError(
                f"the text is {len(ids)} tokens long; {self.name} accepts at most {self.max_tokens}. "
                "Shorten it; it is never truncated silently.", n_tokens=len(ids), context_length=self.max_tokens)
        return torch.tensor([ids], dtype=torch.long)

    def bos_prefix(self) -> list[int]:
        """The ids the tokenizer's own rule puts before a text (Gemma 3: [<bos>]; SmolLM2: []), read by encoding
        a letter with and without its special tokens (model/loaders/card.py bos_rule reads the same). Applied once,
        at the start of a prompt: `encode`, `encode_pieces`."""
        tok = self.tokenizer
        if tok is None:
            return []
        whole, bare = tok.encode("a").ids, tok.encode("a", add_special_tokens=False).ids
        for i in range(len(whole) - len(bare) + 1):
            if whole[i:i + len(bare)] == bare:
                return whole[:i]
        return []

    def _special_ids(self) -> set[int]:
        """The tokenizer's special tokens (its added specials and bos/eos/pad) and the config's bos/eos/pad ids."""
        cfg, out = self.model.cfg, set()
        out.update(i for i in (getattr(cfg, "bos_id", None), getattr(cfg, "eos_id", None),
                               getattr(cfg, "pad_id", None)) if i is not None)
        tok = self.tokenizer
        if tok is not None:
            out.update(int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special)
            out.update(i for i in (tok.token_to_id(t) for t in self.special_tokens.values() if t) if i is not None)
        return out

    def encode_pieces(self, pieces: Sequence[str | Sequence[int]], bos: bool | None = None,
                      check_length: bool = True) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The one way pieces of a prompt become ids: each text piece is encoded WITHOUT special tokens, an id
        piece (a list of ints: random tokens, a repeated filler) is kept as it is, they are joined, and the model's
        BOS rule (`bos_prefix`) is applied once, at the start. Encoding each piece with `tokenizer.encode` and
        joining would put a `<bos>` before every piece on a model whose tokenizer adds one (Gemma 3).

        bos: None = the model's own rule; True = a BOS first whatever the rule (a recipe that defines its input as
        [BOS] + tokens, Olsson et al.'s induction sequence); False = none (an answer appended after a prompt).
        Returns (ids [1, T], spans): spans[i] = (start, end) of piece i in ids, so a builder knows exact positions.
        check_length: over the model's context length is a ContextLengthError (as `encode`)."""
        if isinstance(pieces, (str, bytes)):
            raise TypeError("pieces must be a list of texts or id lists, not one string: use encode(text)")
        if bos is None:
            head = self.bos_prefix()
        elif bos:
            b = self.model.cfg.bos_id
            if b is None and self.tokenizer is not None and self.special_tokens.get("bos_token"):
                b = self.tokenizer.token_to_id(self.special_tokens["bos_token"])
            head = [int(b) if b is not None else 0]  # no BOS named anywhere: id 0 holds its place
        else:
            head = []
        ids, spans = list(head), []
        for p in pieces:
            if isinstance(p, str):
                part = self._need_tokenizer().encode(p, add_special_tokens=False).ids
            else:
                part = _as_list(p)
            spans.append((len(ids), len(ids) + len(part)))
            ids += part
        if check_length and len(ids) > self.max_tokens:
            raise recorder.ContextLengthError(
                f"the text is {len(ids)} tokens long; {self.name} accepts at most {self.max_tokens}. "
                "Shorten it; it is never truncated silently.", n_tokens=len(ids), context_length=self.max_tokens)
        return torch.tensor([ids], dtype=torch.long), spans

    def decode(self, ids) -> str:
        return self._need_tokenizer().decode(_as_list(ids), skip_special_tokens=True)

    def tokens(self, ids) -> list[str]:
        """The raw token pieces of ids (byte-level symbols like Ġ/Ċ kept)."""
        tok = self._need_tokenizer()
        return [tok.id_to_token(i) or f"<{i}>" for i in _as_list(ids)]

    def _ids(self, text_or_ids, chat: bool = False) -> torch.Tensor:
        if isinstance(text_or_ids, str):
            return self.encode(text_or_ids, chat=chat)
        ids = text_or_ids if isinstance(text_or_ids, torch.Tensor) else torch.tensor(text_or_ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        return ids.long()

    # ---------------------------------------------------------------- forward

    def run_with_trace(self, text_or_ids, names: str | Sequence[str] | None = None, hooks=None,
                       budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
                       chat: bool = False, lazy: bool = False, fast: bool = False,
                       last_only: bool = False, layers: bool = False) -> tuple[torch.Tensor, Trace]:
        """Logits [1, T, V] and the trace of the named tensors; meta has tgt_tokens, tgt_ids and the
        model's description, so every view that reads decoder.* works. lazy/fast: a LazyTrace for long
        inputs (DecoderLM.run_with_trace; layers: every tensor of a layer given on demand)."""
        ids = self._ids(text_or_ids, chat)
        meta = {"checkpoint": self.name, "text": text_or_ids if isinstance(text_or_ids, str) else None}
        if self.tokenizer is not None and ids.shape[0] == 1:
            meta["tgt_tokens"] = self.tokens(ids[0])
        with torch.no_grad():
            return self.model.run_with_trace(ids, names=names, hooks=hooks, budget_bytes=budget_bytes, meta=meta,
                                             lazy=lazy, fast=fast, last_only=last_only, layers=layers)

    def trace_bytes(self, n_tokens: int, lazy: bool = False, names=None, layers: bool = False) -> int:
        """The bytes a trace of `n_tokens` tokens would hold: the full capture of `names` (None: every
        capture point), or (lazy) q, k, v of every layer + the O(T·d) names in `names` (+ layers: each
        layer's output and the names outside the layers). A page compares it with its budget before
        running (longest length that fits: `max_tokens_within`)."""
        from model.core.trace import layer_inputs, lazy_plan

        m = self.model
        shapes = m.capture_names(1, n_tokens)
        itemsize = next(m.parameters()).element_size()
        if lazy:
            wanted, _ = lazy_plan(shapes, m.describe()["attention"], names, set(),
                                  layers=list(layer_inputs(m)) if layers else ())
        else:
            wanted = recorder.select_names(list(shapes), names)
        return recorder.estimate_bytes(shapes, wanted, itemsize)

    def max_tokens_within(self, budget_bytes: int, lazy: bool = False, names=None, layers: bool = False) -> int:
        """The longest input (up to the context length) whose trace fits `budget_bytes`; 0 if none."""
        lo, hi = 0, self.max_tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.trace_bytes(mid, lazy, names, layers) <= budget_bytes else (lo, mid - 1)
        return lo

    def run_with_hooks(self, text_or_ids, hooks=None, chat: bool = False) -> torch.Tensor:
        with torch.no_grad():
            return self.model.run_with_hooks(self._ids(text_or_ids, chat), hooks=hooks)

    # ---------------------------------------------------------------- generation

    def turn_end_ids(self) -> list[int]:
        """The special token the chat template writes right after an assistant's message (SmolLM2: <|im_end|>,
        Llama 3: <|eot_id|>, Gemma: <end_of_turn>): what closes the model's turn in a chat. Found by rendering a
        user message and an assistant message and reading the token after the assistant's text; [] without a
        template or tokenizer, or where the template puts no special token there."""
        if self._turn_end is None:
            self._turn_end = _turn_end_ids(self)
        return self._turn_end

    def stop_rule(self, chat: bool = False) -> list[tuple[int, str, str]]:
        """The ids that end a generation, each as (id, token, where it comes from): the model file's own end tokens
        (stop_ids), and in a chat (chat=True) the token its chat template closes the assistant's turn with (see
        STOP_CHAT above: the rule, and why)."""
        rows = [(i, self._piece(i), self.stop_sources.get(i, STOP_GIVEN)) for i in self.stop_ids]
        if chat:
            rows += [(i, self._piece(i), STOP_CHAT) for i in self.turn_end_ids() if i not in self.stop_ids]
        return rows

    def stop_set(self, chat: bool = False) -> set[int]:
        """The ids of stop_rule(chat)."""
        return {i for i, _, _ in self.stop_rule(chat)}

    def generate(self, prompt_or_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, chat: bool = False, hooks=None, record: bool = True,
                 on_step: Callable[[Step], None] | None = None, fast: bool = False) -> Generation:
        """Generate up to max_new_tokens tokens (greedy when temperature == 0), stopping at the model's
        end tokens (stop_rule(chat)). `on_step(step)` is called as each token comes (a page can stream them).
        fast: see `stream`."""
        prompt = self._ids(prompt_or_ids, chat)
        steps = list(self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, chat=chat, hooks=hooks,
                                 record=record, on_step=on_step, fast=fast))  # ids already wrapped: chat only stops
        ids = [s.id for s in steps]
        stopped = bool(steps) and steps[-1].id in self.stop_set(chat)
        body = ids[:-1] if stopped else ids
        text = self.decode(body) if self.tokenizer is not None else ""
        return Generation(text=text, tokens=[s.token for s in steps], ids=ids, prompt_ids=prompt[0].tolist(),
                          steps=steps, stop_reason="eos" if stopped else "length")

    def stream(self, prompt_or_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, chat: bool = False, hooks=None, record: bool = True,
               on_step: Callable[[Step], None] | None = None, fast: bool = False) -> Iterator[Step]:
        """The steps of `generate`, one at a time, as they are computed (a KV cache: each step runs
        the new token only, at its absolute position, so rotary angles are right).

        fast=True (long prompts): the forward runs under recorder.fast_attention() (fused attention:
        the prompt's T×T weights are never formed), and each step's `attention` row is computed from
        the new query and the cached keys with the forward's own functions (trace.last_row). Logits
        equal the step-by-step ones to float rounding. Ignored (step by step) when `hooks` are given."""
        ids, room = self._prompt_and_room(prompt_or_ids, chat, max_new_tokens, temperature, top_k, top_p)
        m = self.model
        grabbed: dict[str, torch.Tensor] = {}
        fast = bool(fast) and not hooks
        modules = m.describe()["attention"]
        own = dict(m.named_modules())
        params = [recompute_params(info, own.get(mod)) for mod, info in modules.items()]
        # Step by step: the weights' last row. Fast: the new query (the row comes from it and the cached
        # keys, trace.last_row), so no hook sits inside the softmax and the fused kernel may run.
        names = [f"{mod}.{'q' if fast else 'weights'}" for mod in modules]

        def grab(t: torch.Tensor, name: str):  # the last query row: [B, H, Tq, Tk or hs] -> [H, Tk or hs]
            grabbed[name] = t[0, :, -1].to("cpu", copy=True)  # a GPU model's too: steps live on the CPU
            return None

        mine = recorder.resolve_hooks(names, {n: grab for n in names}) if record else {}
        cache = m.new_cache()

        def forward(x: torch.Tensor, offset: int):
            logits = m(x, cache=cache, offset=offset, last_only=True)[0, -1].cpu()  # sampling on the CPU
            if record and fast:
                for i, (n, p) in enumerate(zip(names, params, strict=True)):
                    grabbed[n] = last_row(grabbed[n], cache[i]["k"][0], p)
            return logits, torch.stack([grabbed.pop(n) for n in names]) if record else None

        with torch.no_grad(), m.hooks(hooks), recorder.hooking(mine), recorder.fast_attention(fast):
            yield from self._sample(ids, min(max_new_tokens, room), forward, temperature, top_k, top_p, seed,
                                    on_step, self.stop_set(chat))

    def _prompt_and_room(self, prompt_or_ids, chat: bool, max_new_tokens: int, temperature: float, top_k: int,
                         top_p: float) -> tuple[torch.Tensor, int]:
        """The checks every stream makes first: the sampling settings, one prompt, and room after it within the
        model's limit. Returns the prompt's ids [1, T] and how many tokens fit after it."""
        _check_sampling(max_new_tokens, temperature, top_k, top_p)
        ids = self._ids(prompt_or_ids, chat)
        if ids.shape[0] != 1:
            raise ValueError(f"generate takes one prompt (batch 1), got a batch of {ids.shape[0]}")
        room = self.model.cfg.max_len - ids.shape[1]
        if room <= 0:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens, the model's limit is {self.model.cfg.max_len}: "
                             "no room to generate")
        return ids, room

    def _sample(self, ids: torch.Tensor, n: int, forward, temperature: float, top_k: int, top_p: float, seed: int,
                on_step: Callable[[Step], None] | None, stops: set[int] | None = None) -> Iterator[Step]:
        """The sampling loop every stream shares: `forward(x, offset)` runs the new ids x at their absolute offset
        through the model's own KV cache and returns the last position's logits (on the CPU) and its attention row
        ([L, H, T so far], or None); up to `n` tokens, stopping after a stop token (`stops`: stop_set(chat), by
        default the model's own end tokens)."""
        stops = self.stop_set() if stops is None else stops
        gen = torch.Generator().manual_seed(int(seed))  # private: sessions never share a random stream
        offset, x = 0, ids
        for _ in range(n):
            logits, attention = forward(x, offset)
            offset += x.shape[1]
            probs = torch.softmax(logits.float(), dim=-1)
            chosen, drawn = _choose(logits, probs, temperature, top_k, top_p, gen)
            step = make_step(self._piece, chosen, probs, drawn, attention, offset - 1, temperature)
            if on_step is not None:
                on_step(step)
            yield step
            if chosen in stops:
                return
            x = torch.tensor([[chosen]], dtype=torch.long)

    def _piece(self, i: int) -> str:
        if self.tokenizer is None:
            return f"<{i}>"
        return self.tokenizer.id_to_token(i) or f"<{i}>"


def encode_pieces(lm, pieces: Sequence[str | Sequence[int]], bos: bool | None = None
                  ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """`LanguageModel.encode_pieces` for a LanguageModel or a bare DecoderLM (ids only: no tokenizer, so no BOS
    rule; bos=True puts its config's bos_id first). Every prompt builder in model/analysis and viz goes through it."""
    if hasattr(lm, "encode_pieces"):
        return lm.encode_pieces(pieces, bos=bos)
    if any(isinstance(p, str) for p in pieces):
        raise ValueError("text needs a LanguageModel (with a tokenizer); pass token ids to a bare DecoderLM")
    head = []
    if bos:
        b = getattr(getattr(lm, "cfg", None), "bos_id", None)
        head = [int(b if b is not None else 0)]
    ids, spans = list(head), []
    for p in pieces:
        part = _as_list(p)
        spans.append((len(ids), len(ids) + len(part)))
        ids += part
    return torch.tensor([ids], dtype=torch.long), spans


def _turn_end_ids(lm: LanguageModel) -> list[int]:
    """LanguageModel.turn_end_ids: the token right after an assistant's message in the rendered template."""
    tok, mark = lm.tokenizer, "Qx7zQ"  # a text no template rewrites (trimmed, it stays itself)
    if not lm.chat_template or tok is None:
        return []
    from model.loaders.chat import render_chat_template

    try:
        text = render_chat_template(lm.chat_template, [{"role": "user", "content": "Hi"},
                                                       {"role": "assistant", "content": mark}], lm.name,
                                    add_generation_prompt=False, **lm.special_tokens)
    except ValueError:  # a template that refuses this exchange has no turn end the lab can read
        return []
    at = text.rfind(mark)
    after = tok.encode(text[at + len(mark):].lstrip(" "), add_special_tokens=False).ids if at >= 0 else []
    specials = {int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special}
    return [after[0]] if after and after[0] in specials else []


def _as_list(ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    return [int(i) for i in ids]


def make_step(piece, chosen: int, probs: torch.Tensor, drawn: torch.Tensor, attention, position: int,
              temperature: float) -> Step:
    """One generated token's record: the model's top-k next tokens, and (when sampling) what the token was
    drawn from, the chosen one always shown. Shared by the lab's own models and the transformers adapter."""
    top_vals, top_ids = probs.topk(min(TOP_K_RECORDED, probs.numel()))
    top = [(piece(int(i)), float(p)) for i, p in zip(top_ids, top_vals, strict=True)]
    drawn_top = None
    if temperature > 0:
        d_vals, d_ids = drawn.topk(min(TOP_K_RECORDED, drawn.numel()))
        keep = [int(i) for i in d_ids if int(i) != chosen][:TOP_K_RECORDED - 1] + [chosen]
        drawn_top = sorted(((piece(i), float(drawn[i])) for i in keep), key=lambda x: -x[1])
    return Step(id=chosen, token=piece(chosen), prob=float(probs[chosen]), top=top, attention=attention,
                position=position, sampled_prob=float(drawn[chosen]), drawn_top=drawn_top)


def _check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0 = off), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


def _choose(logits: torch.Tensor, probs: torch.Tensor, temperature: float, top_k: int, top_p: float,
            gen: torch.Generator) -> tuple[int, torch.Tensor]:
    """(token, the distribution it was drawn from). Greedy at temperature 0 (the model's own distribution);
    else sample softmax(logits / T) restricted to the top_k tokens and to the smallest set whose
    probability reaches top_p (the most likely token always stays)."""
    if temperature == 0:
        return int(logits.argmax()), probs
    scaled = logits.float() / temperature
    if top_k:
        kth = scaled.topk(min(top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    p = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]  # mass of the more likely tokens
        drop = order[before >= top_p]
        p = p.clone()
        p[drop] = 0
        p = p / p.sum()
    return int(torch.multinomial(p, 1, generator=gen)), p
