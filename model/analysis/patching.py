"""Activation patching between a clean and a corrupted prompt (issue 18 §3), through hooks only.

Run the corrupted prompt, but copy one activation from the clean run into it, and measure how much
of the clean behaviour comes back. The metric is the logit difference at the last position,
LD = logit(answer) - logit(wrong answer) (for IOI: IO - S), normalised so that

    restored = (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted)    0 = corrupted, 1 = fully restored.

- residual map [L, T]: the input of layer i (`decoder.embed.out` for layer 0, `decoder.layers.{i-1}.out`
  after) at one position (TransformerLens's `get_act_patch_resid_pre`);
- head map [L, H]: one head's z (weights @ V) at every position, so only its output through W^O
  changes (TransformerLens's `get_act_patch_attn_head_out_all_pos`).

One batch row per patch, `batch` rows per forward; every hook is per call (the recorder's ContextVar).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model.analysis.inputs import LOGITS_BUDGET_BYTES, as_decoder, as_ids, fit_batch  # noqa: F401 (re-exported)


def logit_diff(logits: torch.Tensor, good: int, bad: int) -> torch.Tensor:
    """[B]: logit(good) - logit(bad) at the last position."""
    last = logits[:, -1].double()
    return last[:, good] - last[:, bad]


def resid_names(n_layers: int) -> list[str]:
    """The residual stream entering each layer: embed.out, then each layer's output."""
    return ["decoder.embed.out"] + [f"decoder.layers.{i}.out" for i in range(n_layers - 1)]


@dataclass
class Patching:
    resid: np.ndarray  # [L, T]: share of the logit difference restored by patching layer i's input at t
    heads: np.ndarray | None  # [L, H]: ... by patching one head's z at every position
    clean: float  # LD on the clean prompt
    corrupted: float  # LD on the corrupted prompt
    clean_tokens: list[str] | None
    corrupted_tokens: list[str] | None
    metric: str = "logit difference at the last position, normalised: 0 = corrupted, 1 = clean"


def _rows_hook(rows: torch.Tensor, index: torch.Tensor, source: torch.Tensor):
    """A hook copying the clean activation `source` (batch 1) into batch row rows[r] at index[r] of
    axis 1: a position of the residual [B, T, D], or a head of z [B, H, T, hs] (all its positions)."""

    def hook(t: torch.Tensor, name: str) -> torch.Tensor:
        t = t.clone()
        t[rows, index] = source[0, index]
        return t

    return hook


@torch.no_grad()
def activation_patching(lm, clean, corrupted, good: int, bad: int, heads: bool = True,
                        batch: int = 32, progress=None) -> Patching:
    """The residual (layer x position) and head (layer x head) patching maps; `clean` and `corrupted`
    are texts or ids of the same length; `good`/`bad` the token ids whose logit difference is the metric.
    progress(done, total): called after each batched forward with the patched runs done so far (a page's
    progress bar)."""
    m = as_decoder(lm)
    c_ids, x_ids = as_ids(lm, clean)[:1], as_ids(lm, corrupted)[:1]
    if c_ids.shape != x_ids.shape:
        raise ValueError(f"the clean and corrupted prompts must have the same number of tokens "
                         f"({c_ids.shape[1]} vs {x_ids.shape[1]}): patching copies position by position")
    L, H, T = m.cfg.n_layers, m.cfg.n_heads, c_ids.shape[1]
    names = resid_names(L)
    heads_names = [f"decoder.layers.{i}.self_attn.z" for i in range(L)]
    clean_logits, trace = m.run_with_trace(c_ids, names=names + (heads_names if heads else []))
    ld_clean = float(logit_diff(clean_logits, good, bad)[0])
    ld_corr = float(logit_diff(m(x_ids), good, bad)[0])
    span = ld_clean - ld_corr
    batch = fit_batch(batch, T, m.cfg.vocab_size)
    if abs(span) < 1e-6:
        raise ValueError(f"the clean and corrupted prompts give the same logit difference ({ld_clean:.3g}): "
                         "nothing to restore")

    total = L * T + (L * H if heads else 0)
    done = [0]

    def run(jobs: list[tuple[str, int]]) -> np.ndarray:
        """jobs: (hook point, index) per row -> normalised restored share per row."""
        out = []
        for s in range(0, len(jobs), batch):
            chunk = jobs[s:s + batch]
            by_point: dict[str, list[tuple[int, int]]] = {}
            for r, (point, idx) in enumerate(chunk):
                by_point.setdefault(point, []).append((r, idx))
            hooks = {p: _rows_hook(torch.tensor([r for r, _ in ri]), torch.tensor([i for _, i in ri]), trace[p])
                     for p, ri in by_point.items()}
            logits = m.run_with_hooks(x_ids.expand(len(chunk), -1), hooks=hooks)
            out.append(((logit_diff(logits, good, bad) - ld_corr) / span).numpy())
            done[0] += len(chunk)
            if progress is not None:
                progress(done[0], total)
        return np.concatenate(out)

    def run_resid() -> np.ndarray:
        """The residual map, position by position (issue 26 §3): a patch at position t changes nothing
        before t (causal attention), so the corrupted run's keys and values of positions < t are computed
        once and every layer's patch at t runs only positions t.. (a KV cache, as in generation), with the
        logits of the last position only. About 2.5x fewer FLOPs than one full forward per patch; the
        same numbers up to float32 rounding (tests/test_lm_phenomena.py, bench/lm_pages.py)."""
        full = m.new_cache()
        m(x_ids, cache=full)  # the corrupted run's keys and values at every position
        out = np.zeros((L, T))
        step = max(1, batch)
        for t in range(T):
            for s in range(0, L, step):
                layers = list(range(s, min(L, s + step)))
                R = len(layers) + 1  # + the last row, unpatched: this path's own corrupted baseline, so that a
                # patch that changes nothing reads 0 exactly, not the float noise between two code paths
                cache = [{k: v[:, :, :t].expand(R, -1, -1, -1) for k, v in c.items()} for c in full]
                by_point: dict[str, list[int]] = {}
                for r, i in enumerate(layers):
                    by_point.setdefault(names[i], []).append(r)
                hooks = {p: _rows_hook(torch.tensor(rows), torch.zeros(len(rows), dtype=torch.long),
                                       trace[p][:, t:t + 1]) for p, rows in by_point.items()}
                with m.hooks(hooks):
                    logits = m(x_ids[:, t:].expand(R, -1), cache=cache, offset=t, last_only=True)
                ld = logit_diff(logits, good, bad)
                out[layers, t] = ((ld[:-1] - ld[-1]) / span).numpy()
                done[0] += R - 1
                if progress is not None:
                    progress(done[0], total)
        return out

    resid = run_resid()
    head_map = run([(heads_names[i], h) for i in range(L) for h in range(H)]).reshape(L, H) if heads else None
    toks = getattr(lm, "tokens", None)
    return Patching(resid, head_map, ld_clean, ld_corr,
                    toks(c_ids[0]) if toks and lm.tokenizer else None,
                    toks(x_ids[0]) if toks and lm.tokenizer else None)
