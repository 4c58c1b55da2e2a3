"""Four browser sessions at once against one server (issue 12 §2, the small version of bench/load.py):
each has its own sentence and switches heads and pages; no session ever shows another's sentence,
no exception appears, and the server's memory returns near its level after the first session once
they have closed.

Run: pytest -m browser tests/test_sessions.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_support import NO_LM_WARM, ROOT, free_port, start_server, stop_server, wait_drawn

pytestmark = pytest.mark.browser

SENTENCES = ["3 november 2023", "5 may 2021", "17 june 1999", "28 february 2010"]
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"
# two interleaved rounds of head switches (each session's run between the others'): a third round (head 1) was five
# more page runs and no new case (tests/test_browser.py switches heads by button and by select)
HEADS = (2, 3)
TTL = "2"  # seconds a closed session's state is kept (Streamlit's default is 120)


def rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.fixture(scope="module")
def short_ttl_server(monkeypatch_module):
    monkeypatch_module.setenv("STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL", TTL)
    # no SmolLM2 warm-up: no page here shows it, and its load (~1 GB) would land inside the memory comparison
    proc = start_server(ROOT / "app.py", free_port(), env=NO_LM_WARM)
    port = proc.args[proc.args.index("--server.port") + 1]
    yield f"http://127.0.0.1:{port}", proc.pid
    stop_server(proc)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def pick_head(page, h: int) -> None:
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name="Head", exact=True).first.click()
    page.get_by_role("option", name=str(h), exact=True).click()
    page.wait_for_function("h => [...document.querySelectorAll('.js-plotly-plot')].some("
                           "el => (el.layout?.title?.text || '').includes('· head ' + h + ' ·'))", arg=h,
                           timeout=120_000)
    wait_drawn(page)


def own_sentence_only(page, sentence: str) -> list[str]:
    """Figure titles that quote a sentence other than this session's (each names its sentence)."""
    return [t for t in page.evaluate(TITLES) if "“" in t and f"“{sentence}”" not in t]


def tour(pages: list, sentences: list[str]) -> list[str]:
    """Every page loads its sentence (all at once), switches heads (interleaved), goes Attention ->
    Tokens -> Attention; returns the problems seen (another session's sentence, an exception)."""
    problems = []
    for page, s in zip(pages, sentences, strict=True):
        page.goto(f"{page.base}/?text={s.replace(' ', '+')}", wait_until="commit")
    for page in pages:
        wait_drawn(page)
    for h in HEADS:
        for page in pages:
            pick_head(page, h)
    for page in pages:
        page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Tokens & embeddings").click()
    for page in pages:
        page.wait_for_function("() => location.pathname === '/tokens'")
        wait_drawn(page)
        page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Attention", exact=True).click()
    for page, s in zip(pages, sentences, strict=True):
        page.wait_for_function("() => location.pathname === '/'")
        wait_drawn(page)
        if not any("· head 3 ·" in t for t in page.evaluate(TITLES)):
            problems.append(f"{s}: the view was not kept across pages")
        problems += own_sentence_only(page, s)
        if page.locator('[data-testid="stException"]').count():
            problems.append(page.locator('[data-testid="stException"]').first.inner_text()[:300])
    return problems


def sessions(browser, base: str, n: int) -> tuple[list, list]:
    contexts = [browser.new_context(viewport={"width": 1200, "height": 1600}) for _ in range(n)]
    pages = [c.new_page() for c in contexts]
    for p in pages:
        p.base = base
    return contexts, pages


def settle_after_close(browser) -> None:
    probe = browser.new_context().new_page()
    probe.wait_for_timeout(2 * 1000 * int(TTL) + 1000)  # the TTL is a duration: nothing to wait on
    probe.context.close()


def test_four_sessions_at_once_stay_apart(short_ttl_server, browser):
    base, pid = short_ttl_server
    contexts, pages = sessions(browser, base, 1)  # the first session: loads models, imports, caches
    try:
        assert not tour(pages, SENTENCES[:1])
    finally:
        contexts[0].close()
    settle_after_close(browser)
    mem_first = rss_mb(pid)
    contexts, pages = sessions(browser, base, len(SENTENCES))
    try:
        problems = tour(pages, SENTENCES)
    finally:
        for c in contexts:
            c.close()
    assert not problems, problems
    settle_after_close(browser)  # closed sessions are dropped after the TTL; their traces and figures too
    assert rss_mb(pid) <= 1.10 * mem_first, (rss_mb(pid), mem_first)
