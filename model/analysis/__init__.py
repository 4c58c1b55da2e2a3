"""Analyses over the model, built on its hooks: decoding and evaluation under an intervention,
head importance and a per-head summary, attribution (four ways), comparing two inputs.
Language models (import the modules): `phenomena` (sink, previous/duplicate-token and induction head
detectors, repeat loss, ablation with a random control, token-0 blocking), `patching` (activation
patching), `ioi` (IOI prompts, direct logit attribution), `logit_lens`, `qk` (the Q/K map).
No UI imports here (pages draw what these return)."""

from model.analysis.attribution import Attribution, attribute, attribution_for, rollout, rollout_seq2seq, spearman
from model.analysis.compare import HeadFlip, compare_inputs, preference_importance
from model.analysis.heads import (
                    HeadImportance,
                    attention_modules,
                    exact_match_importance,
                    head_importance,
                    head_summary,
                    importance_for,
)
from model.analysis.runs import (
                    BeforeAfter,
                    Decoded,
                    before_after,
                    decode_text,
                    exact_match,
                    greedy,
                    held_out,
                    teacher_forced,
)

__all__ = [
    "Attribution", "BeforeAfter", "Decoded", "HeadFlip", "HeadImportance", "attention_modules", "attribute",
    "attribution_for", "before_after", "compare_inputs", "decode_text", "exact_match", "exact_match_importance",
    "greedy", "head_importance", "head_summary", "held_out", "importance_for", "preference_importance",
    "rollout", "rollout_seq2seq", "spearman", "teacher_forced",
]
