"""Running a checkpoint under an intervention: greedy decoding with per-token log-probs, exact match
on held-out pairs, and the before/after pair the Experiments page draws.

Decoding here recomputes the whole prefix at every step (no key/value cache), as the seeds' models
and a teacher-forced pass do: an intervention that needs every position at once (seed 001's
transposed scores, no look-ahead mask, mean ablation) then acts in free-running decoding exactly as
it does in a teacher-forced pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from model.core.trace import Trace


@dataclass
class Decoded:
    """One greedy output: tokens (without [EOS]), the log-prob of every token chosen (with [EOS] if it
    ended), and whether it ended before the limit."""

    text: str
    tokens: list[str]
    ids: list[int]
    logprobs: list[float]
    finished: bool


@torch.no_grad()
def greedy(model, src: torch.Tensor, bos: int, eos: int, hooks=None, max_new_tokens: int = 64
           ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Batched greedy decoding under `hooks`, full prefix every step. Per row: ids (without [EOS]),
    log-probs of the chosen tokens ([EOS] included when reached), finished."""
    B = src.shape[0]
    limit = min(max_new_tokens, model.cfg.max_len - 1)
    ys = torch.full((B, 1), bos, dtype=torch.long)
    lps = torch.zeros(B, 0)
    done = torch.zeros(B, dtype=torch.bool)
    with model.hooks(hooks):
        memory, src_pad = model.encode(src)
        for _ in range(limit):
            logp = model.decode(ys, memory, src_pad)[:, -1].log_softmax(-1)  # (B, V)
            nxt = logp.argmax(-1)
            ys = torch.cat([ys, nxt[:, None]], 1)
            lps = torch.cat([lps, logp.gather(1, nxt[:, None])], 1)
            done |= nxt == eos
            if bool(done.all()):
                break
    ids, logprobs, finished = [], [], []
    for row, lp in zip(ys[:, 1:].tolist(), lps.tolist(), strict=True):
        end = row.index(eos) if eos in row else None
        ids.append(row[:end])
        logprobs.append(lp[: end + 1] if end is not None else lp)
        finished.append(end is not None)
    return ids, logprobs, finished


def decode_text(ckpt, text: str, hooks=None, max_new_tokens: int | None = None) -> Decoded:
    """Greedy translation of one text under `hooks`."""
    t = ckpt.tgt_tokenizer
    limit = max_new_tokens or _limit(ckpt)
    (ids,), (lp,), (fin,) = greedy(ckpt.model, ckpt.encode_source(text), t.bos_id, t.eos_id, hooks, limit)
    return Decoded(t.decode(ids), t.tokens(ids), ids, lp, fin)


def _limit(ckpt) -> int:
    """Twice the longest target the task makes (a broken model may never say [EOS])."""
    from model.toy.tasks import TASKS

    task = TASKS.get(ckpt.meta.get("task", ""))
    return 2 * task.max_tgt_len + 2 if task else 64


def held_out(ckpt, n: int = 100, seed: int = 0) -> list[tuple[str, str]]:
    """`n` pairs of the checkpoint's task from its test split (never seen in training)."""
    from model.toy.tasks import TASKS

    task = ckpt.meta.get("task")
    if task not in TASKS:
        raise ValueError(f"checkpoint {ckpt.name!r} has no known task ({task!r}): no held-out samples")
    return TASKS[task].sample(n, seed=seed, split="test")


def exact_match(ckpt, pairs: list[tuple[str, str]], hooks=None, batch_size: int = 25,
                progress: Callable[[int, int], None] | None = None) -> float:
    """Share of pairs whose greedy output under `hooks` equals the target; `progress(done, total)`
    after each batch."""
    t = ckpt.tgt_tokenizer
    hits = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        rows = [ckpt.encode_source(s)[0] for s, _ in chunk]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=ckpt.cfg.pad_id)
        ids, _, _ = greedy(ckpt.model, src, t.bos_id, t.eos_id, hooks, _limit(ckpt))
        hits += sum(t.decode(o) == t.decode(t.encode(y)) for o, (_, y) in zip(ids, chunk, strict=True))
        if progress:
            progress(min(i + batch_size, len(pairs)), len(pairs))
    return hits / len(pairs) if pairs else float("nan")


@dataclass
class BeforeAfter:
    """The same input without and with an intervention.

    before / after: greedy outputs. trace_before / trace_after: teacher-forced traces of each run on
    its own output (what each model looked at to say what it said). trace_same: the intervened model
    teacher-forced on the *before* output, so its attention can be subtracted cell by cell from
    trace_before's."""

    before: Decoded
    after: Decoded
    trace_before: Trace
    trace_after: Trace
    trace_same: Trace


def _trace(ckpt, src, ids: list[int], hooks, names, meta: dict) -> Trace:
    t = ckpt.tgt_tokenizer
    tgt = torch.tensor([[t.bos_id, *ids]])
    meta = meta | {"tgt_tokens": t.tokens(tgt[0].tolist()), "next_tokens": t.tokens([*ids, t.eos_id])}
    with torch.no_grad():
        return ckpt.model.run_with_trace(src, tgt, names=names, hooks=hooks, meta=meta)[1]


def before_after(ckpt, text: str, hooks, names="*.weights") -> BeforeAfter:
    """Decode `text` without and with `hooks`, and trace both (see BeforeAfter)."""
    src = ckpt.encode_source(text)
    before, after = decode_text(ckpt, text), decode_text(ckpt, text, hooks)
    meta = {"src_tokens": ckpt.src_tokenizer.tokens(src[0].tolist()), "checkpoint": ckpt.name, "text": text}
    return BeforeAfter(before, after,
                       _trace(ckpt, src, before.ids, None, names, meta),
                       _trace(ckpt, src, after.ids, hooks, names, meta),
                       _trace(ckpt, src, before.ids, hooks, names, meta))


def teacher_forced(ckpt, trace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src (1, S), tgt (1, T) = [BOS] + output, labels (1, T) = output + [EOS]) of a checkpoint's
    teacher-forced trace (its meta holds the ids it ran on)."""
    src = torch.tensor(trace.meta["src_ids"])[:1]
    tgt = torch.tensor(trace.meta["tgt_ids"])[:1]
    labels = torch.cat([tgt[:, 1:], torch.tensor([[ckpt.tgt_tokenizer.eos_id]])], 1)
    return src, tgt, labels


@torch.no_grad()
def teacher_forced_loss(ckpt, pairs: list[tuple[str, str]], hooks=None) -> dict[str, float]:
    """On a padded batch of `pairs`, teacher-forced under `hooks`: the mean cross-entropy over real
    tokens ("loss"), seed 001's version averaged over [PAD] too ("seed_loss"), the share of real
    tokens ("real_share") and the share of positions whose argmax is right ("token_accuracy")."""
    from model import interventions as iv
    from model.toy.train import make_batch

    src, tgt, labels = make_batch(pairs, ckpt.src_tokenizer, ckpt.tgt_tokenizer, ckpt.cfg.pad_id, ckpt.src_eos)
    logits = ckpt.model.run_with_hooks(src, tgt, hooks=hooks)
    real = labels != ckpt.cfg.pad_id
    return {"loss": float(iv.pad_loss(logits, labels, ckpt.cfg.pad_id)),
            "seed_loss": float(iv.seed_pad_loss(logits, labels, ckpt.cfg.pad_id)),
            "real_share": float(real.float().mean()),
            "token_accuracy": float((logits.argmax(-1) == labels)[real].float().mean())}
