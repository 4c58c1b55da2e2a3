"""A class that does not wait (issue 26 §3): the language-model pages' times against their targets.

    .venv/bin/python bench/lm_pages.py [--parts server,new,generate,long,switch] [--omp-active]
    (--parts longviews: the long document's pages without the needle section)

Prints one table, each row: what was done, seconds, target, ratio, verdict.
- server: every lesson and every /phenomena section on its defaults, a new session's script run (AppTest,
  in this process) once the server is warm (viz/ui/warmup.warm(), which also fills the per-server shared
  cache of analyses, model/analysis/shared.py); the first session's run beside it. Target <= 1 s.
- new: what a student's own choice computes (nothing cached): induction with a new seed and its
  ablation, the IOI ablation, the patching map, token 0 blocked in each head, /llm's trace of a 222-token
  prompt. Targets <= 10 s (induction, ablation), <= 20 s (patching map).
- generate: SmolLM2 streaming 24 tokens after a 34-token prompt (greedy), tokens/s between the first and
  the last token, and the first token's latency. Target >= 10 tokens/s.
- long (issue 31 §2): /phenomena's needle section cold (the grid + its ablation; target <= 30 s quiet), and a
  2,380-token document with a needle in the middle: the Attention page's first view, another head, zoom window
  and document position (targets <= 1 s warm), the same on /llm, Inside a layer's first view after them (it reads
  one layer from their trace; target <= 5 s) and, for reference, with no trace held (its own forward). Server side
  (AppTest); in the browser: bench/long_browser.py.
- switch: a real browser (Playwright + /usr/bin/chromium) on `streamlit run app.py`: a plain page switch
  through the sidebar, click -> the new page's script finished and drawn, with the server CPU it took.
  Target <= 1.5 s (median).

Like the server (viz/ui/warmup.py), this process sets OMP_WAIT_POLICY=PASSIVE before torch loads;
--omp-active leaves OpenMP's default (spinning) policy, to see what it costs on a busy machine.
Times are wall seconds with CPU seconds beside: on a shared, busy machine compare within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
TARGET_PAGE_S = 1.0  # a lesson or a /phenomena section on its defaults, once warm
TARGET_NEW_S = 10.0  # a new seed or prompt: induction, ablation
TARGET_PATCH_S = 20.0  # the patching map on a new prompt
TARGET_TOKENS_S = 10.0  # generation, streamed
TARGET_SWITCH_S = 1.5  # a plain page switch in the browser
PROMPT_34 = ("The lab opened at nine. Students came in, sat down at the long tables, and waited for the "
             "first lesson to begin, while the teacher wrote on the board.")  # 34 tokens for SmolLM2
PHENOMENA = ("sinks", "patterns", "induction", "ioi")
ROWS: list[tuple[str, float, float | None, str, str]] = []  # (what, seconds, cpu, target text, verdict)


def row(what: str, seconds: float, cpu: float | None, target: float | None, higher_is_better: bool = False,
        unit: str = "s") -> None:
    if target is None:
        ROWS.append((what, seconds, cpu, "", ""))
        return
    ok = seconds >= target if higher_is_better else seconds <= target
    ratio = seconds / target
    ROWS.append((what, seconds, cpu, f"{'>=' if higher_is_better else '<='} {target:g} {unit}  ratio {ratio:.2f}",
                 "ok" if ok else "MISSED"))
    print(f"  {what}: {seconds:.2f} {unit}" + (f" (cpu {cpu:.2f} s)" if cpu is not None else ""), flush=True)


def timed(fn, *args, **kw):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0, time.process_time() - c0


# ---------------------------------------------------------------- server time (AppTest)


def open_page(file: str, query: dict):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=900)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    at.switch_page(file)
    t0, c0 = time.perf_counter(), time.process_time()
    at.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    errors = [e.value for e in at.exception] + [e.value for e in at.error]
    return wall, cpu, errors


def server_part() -> None:
    from viz import lessons as LS
    from viz.ui import warmup

    _, wall, cpu = timed(warmup.warm)
    print(f"warm-up (toy models, SmolLM2, the shared analyses): {wall:.1f} s wall, {cpu:.1f} s cpu", flush=True)
    pages = [(f"lesson {i + 1} ({lesson.slug})", "viz/pages/lessons.py", {"lesson": i + 1})
             for i, lesson in enumerate(LS.LESSONS)]
    pages += [(f"/phenomena {v}", "viz/pages/phenomena.py", {"checkpoint": "smollm2", "phen": v}) for v in PHENOMENA]
    for what, file, query in pages:
        first, first_cpu, _ = open_page(file, query)  # the first session (what warm-up did not cover)
        wall, cpu, errors = open_page(file, query)  # a new session once warm: the class's 30th student
        note = f" [first session {first:.2f} s]" + (f" ERRORS: {errors[:1]}" if errors else "")
        row(f"{what}, defaults, warm{note}", wall, cpu, TARGET_PAGE_S)


# ---------------------------------------------------------------- a student's own choice (nothing cached)


def new_part() -> None:
    from model import load_model
    from model.analysis import phenomena as PH
    from model.analysis import shared as AN
    from viz.ui import lm_models

    lm = load_model("smollm2")
    AN.ioi(lm)  # the page has it (warm) before any toggle below
    seed = 1 + int(time.time()) % 9000  # a seed no cache holds
    (_, w1, c1), (_, w2, c2) = timed(AN.induction, lm, 50, seed), timed(AN.induction_ablation, lm, 50, seed, 5, "zero")
    row(f"induction, new seed {seed} (scores + loss + ablation of the top 5 vs 3 controls)", w1 + w2, c1 + c2,
        TARGET_NEW_S)
    _, w, c = timed(AN.ioi_ablation, lm, 4, "zero", 2)  # a k the warm-up did not compute
    row("IOI ablation (12 prompts x top heads + 2 controls, batched)", w, c, TARGET_NEW_S)
    _, w, c = timed(AN.patching, lm, 1)
    row(f"patching map, IOI prompt 1 ({PH.as_ids(lm, AN.ioi(lm).prompts[1].text).shape[1]} positions x 30 layers)",
        w, c, TARGET_PATCH_S)
    text = AN.ioi(lm).prompts[2].text
    _, w, c = timed(AN.sinks_per_head, lm, text)
    row("token 0 blocked in each head alone (270 runs, batched), a new prompt", w, c, None)
    rm = lm_models.load("smollm2")
    long = (PROMPT_34 + " ") * 7
    n = lm.encode(long).shape[1]
    _, w, c = timed(rm.trace, long)
    row(f"/llm heads view: the trace of a new {n}-token prompt", w, c, TARGET_NEW_S)


def generate_part() -> None:
    from model import load_model

    lm = load_model("smollm2")
    n = lm.encode(PROMPT_34).shape[1]
    list(lm.stream(PROMPT_34, max_new_tokens=2))  # first use
    t0, c0 = time.perf_counter(), time.process_time()
    stamps = [time.perf_counter() for _ in lm.stream(PROMPT_34, max_new_tokens=24)]
    cpu = time.process_time() - c0
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    row(f"generate 24 tokens after a {n}-token prompt: streamed rate (first token after {stamps[0] - t0:.2f} s; "
        f"{24 / cpu:.0f} tokens per CPU-second)", rate, cpu, TARGET_TOKENS_S, higher_is_better=True, unit="tokens/s")


# ---------------------------------------------------------------- long documents (issue 31 §2)

TARGET_NEEDLE_S = 30.0  # /phenomena?phen=needle cold (nothing warmed), quiet
TARGET_HEAD_SWITCH_S = 1.0  # another head (or zoom window, document position) on a 2,380-token prompt, warm
TARGET_LAYER_S = 5.0  # Inside a layer's first view of a 2,380-token prompt
LONG_TOKENS = 2380  # the engineer's 1,800-word document with a needle in the middle (issue 31)


def long_part(needle: bool = True) -> None:
    """The needle section cold, and the pages on a 2,380-token document: the Attention page's first view, a head
    switch, a zoom and a document position there and on /llm; Inside a layer's first view. needle=False (--parts
    longviews): the pages only."""

    from model import load_model

    lm = load_model("smollm2")
    if needle:
        _needle_rows(lm)
    long_views_part(lm)


def _needle_rows(lm) -> None:
    from model.analysis import long as LG
    from model.analysis import shared as AN

    lengths = AN.needle_lengths(lm)
    grid, w, c = timed(LG.needle_grid, lm, lengths, AN.NEEDLE_DEPTHS, AN.NEEDLE_KEY)  # not the shared cache: cold
    prompts = [LG.needle_prompt(lm, max(lengths), d, AN.NEEDLE_ABLATE_KEY) for d in AN.NEEDLE_ABLATE_DEPTHS]
    _, w2, c2 = timed(LG.ablate_retrieval, lm, prompts, grid.retrieval, k=AN.NEEDLE_ABLATE_K, n_controls=2)
    row(f"/phenomena needle cold: grid ({len(lengths) * len(AN.NEEDLE_DEPTHS)} prompts of "
        f"{'/'.join(map(str, lengths))} tokens) + ablation of the top {AN.NEEDLE_ABLATE_K} vs 2 controls "
        f"[grid {w:.1f} s]", w + w2, c + c2, TARGET_NEEDLE_S)


def long_views_part(lm) -> None:
    """The pages on a 2,380-token document (issue 31 §2), server side (AppTest)."""
    from streamlit.testing.v1 import AppTest

    from model.analysis import long as LG
    from model.analysis import shared as AN

    def document(length: int) -> str:
        return lm.tokenizer.decode(LG.needle_prompt(lm, length, 0.5, AN.NEEDLE_KEY).ids[0].tolist())

    doc = document(LONG_TOKENS)  # decoded and read again, the text has other tokens: one correction step
    doc = document(round(LONG_TOKENS * LONG_TOKENS / lm.encode(doc).shape[1]))
    n = lm.encode(doc).shape[1]

    def page(file: str, **state):
        at = AppTest.from_file(APP, default_timeout=900)
        at.query_params.update({"checkpoint": "smollm2"})
        at.session_state["source_text"] = doc
        for k, v in state.items():
            at.session_state[k] = v
        at.switch_page(file)
        return at

    def run(at, what: str, target: float | None, **expect):
        t0, c0 = time.perf_counter(), time.process_time()
        at.run()
        errors = [e.value for e in at.exception] + [e.value for e in at.error]
        errors += [f"?{k}={at.query_params.get(k)} (wanted {v})" for k, v in expect.items()
                   if str(at.query_params.get(k)) != str(v)]  # the page really drew what was asked
        row(what + (f" ERRORS: {errors[:1]}" if errors else ""), time.perf_counter() - t0, time.process_time() - c0,
            target)

    # the Attention page, then /llm on the same trace (its head select is the page's own: a full rerun)
    for file, title, first, head_key, head, key, where in (
            ("attention", "Attention page", "first view of a {n:,}-token document (lazy trace)",
             "attn_long_head", 3, "attn", n // 2),
            ("llm", "/llm", "first view of the {n:,}-token document (the trace is there; its per-head statistics)",
             "llm_head", 4, "llm", n // 3)):
        at = page(f"viz/pages/{file}.py")
        run(at, f"{title}, {first.format(n=n)}", None)
        at.session_state[head_key] = head
        run(at, f"{title}, another head ({n:,} tokens, warm)", TARGET_HEAD_SWITCH_S, head=head)
        at.session_state[f"{key}_long_q0"] = at.session_state[f"{key}_long_k0"] = where
        run(at, f"{title}, another zoom window ({n:,} tokens)", TARGET_HEAD_SWITCH_S)
        at.session_state[f"{key}_long_pos"] = where
        run(at, f"{title}, another document position ({n:,} tokens)", TARGET_HEAD_SWITCH_S, pos=where)
    at = page("viz/pages/layer.py")  # reads one layer from the trace the pages above hold (viz/ui/models.py)
    run(at, f"Inside a layer, first view of the {n:,}-token document (after the Attention page)", TARGET_LAYER_S)
    at.session_state["ly_layer"] = 20
    run(at, f"Inside a layer, another layer ({n:,} tokens)", TARGET_LAYER_S)
    from viz.ui import models  # the reference: no page has the trace yet, so this page runs the forward itself

    models._LONG_TRACES.clear()
    at = page("viz/pages/layer.py")
    run(at, "Inside a layer, first view with no trace held yet (its own forward, as every visit was before the "
            "pages shared one)", None)


# ---------------------------------------------------------------- a page switch in the browser


def switch_part(switches: int = 3) -> None:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "bench"))
    from load import cpu_seconds, quiet_cpu

    import app as bench  # bench/app.py: servers and the browser

    port = bench.free_port()
    proc = bench.start_server(ROOT / "app.py", port)
    try:
        bench.wait_health(port)
        quiet_cpu(proc.pid, 2.0)  # warm-up done
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(300_000)
            page.goto(f"http://127.0.0.1:{port}/")
            bench.wait_drawn(page)
            tour = [("Tokens & embeddings", "/tokens"), ("Attention", "/"), ("Inside a layer", "/layer"),
                    ("Attention", "/")] * switches
            times, cpus = [], []
            for k, (link, path) in enumerate(tour):
                quiet_cpu(proc.pid, 0.3)
                c0 = cpu_seconds(proc.pid)
                t0 = time.perf_counter()
                page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=link, exact=True).click()
                page.wait_for_function(f"() => location.pathname === {path!r}")
                page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]')
                page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached")
                page.wait_for_load_state("networkidle")
                took = time.perf_counter() - t0
                cpus.append(quiet_cpu(proc.pid, 0.3) - c0)
                if k >= 2:  # the first visit of each page warms its imports
                    times.append(took)
            browser.close()
    finally:
        bench.stop_server(proc)
    med = statistics.median(times)
    row(f"page switch (sidebar link), median of {len(times)}: max {max(times):.2f} s; server CPU median "
        f"{statistics.median(cpus[2:]):.2f} s", med, None, TARGET_SWITCH_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="server,new,generate,long,switch")
    ap.add_argument("--omp-active", action="store_true", help="OpenMP's default spinning wait policy")
    args = ap.parse_args()
    if not args.omp_active:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server does (viz/ui/warmup.py)
    sys.path.insert(0, str(ROOT))
    parts = args.parts.split(",")
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    for part in ("server", "new", "generate", "long", "longviews", "switch"):
        if part in parts:
            print(f"[{part}]", flush=True)
            {"server": server_part, "new": new_part, "generate": generate_part, "long": long_part,
             "longviews": lambda: long_part(needle=False), "switch": switch_part}[part]()
    import torch

    print(f"\nissue 26 §3 on this machine ({os.cpu_count()} cores, load average {load0:.1f} at the start and "
          f"{os.getloadavg()[0]:.1f} at the end; torch {torch.get_num_threads()} threads; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'default')}); {time.perf_counter() - t0:.0f} s in all")
    width = max(len(r[0]) for r in ROWS)
    for what, v, cpu, target, verdict in ROWS:
        cpu_s = f"cpu {cpu:6.2f} s" if cpu is not None else " " * 12
        print(f"{what:{width}s}  {v:8.2f}  {cpu_s}  {target:28s} {verdict}")


if __name__ == "__main__":
    main()
