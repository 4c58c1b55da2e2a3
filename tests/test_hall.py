"""A lecture hall (issue 20 §2): deploy/hall.sh puts 2 replicas behind HAProxy with cookie affinity;
6 real-browser sessions go through the proxy, one replica is killed while its sessions are open, and
every one of them must come back on the live replica with the same view within 10 s.

The same drill at full size: `.venv/bin/python bench/load.py --hall 2 --sessions 40`.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import load  # noqa: E402  (bench/load.py: the class, the hall helpers and the drill)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PORT = 8700  # the hall's proxy; replicas on 8711, 8712 (single test servers use 8501-8600 or free ports)
BASE = f"http://127.0.0.1:{PORT}"


def boot_id(cookie: str | None = None) -> str:
    """The boot id of the replica that answers a request carrying the affinity cookie `cookie`."""
    req = urllib.request.Request(BASE + "/_al/replica", headers={"Cookie": f"ATTNLAB={cookie}"} if cookie else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode().strip()


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def hall():
    if not os.path.exists(load.bench.CHROMIUM):
        pytest.skip(f"{load.bench.CHROMIUM} is missing: install it with `bash .ci/browser-setup.sh`")
    # The replicas inherit this process's environment: no lessons' analyses warmed at start (browser_support
    # .start_server says why); the drill's sessions open the toy models' pages.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_LAB_WARM_ANALYSES", "0")
        load.hall("up", PORT, "2", extra="--server.disconnectedSessionTTL 5")
    try:
        yield load.replica_pids(PORT)
    finally:
        load.hall("down", PORT)


def test_generated_config_has_affinity_websockets_and_health_checks(hall):
    cfg = (load.hall_run_dir(PORT) / "haproxy.cfg").read_text()
    lines = [x.split("#")[0].strip() for x in cfg.splitlines()]
    assert "cookie ATTNLAB insert indirect nocache httponly" in lines
    assert "option redispatch" in lines
    assert "timeout tunnel 2h" in lines
    assert "http-check send meth GET uri /_stcore/health ver HTTP/1.1 hdr Host localhost" in lines
    assert [x for x in lines if x.startswith("server ")] == [
        f"server r{i} 127.0.0.1:{PORT + 10 + i} cookie r{i}" for i in (1, 2)]
    assert sorted(hall) == ["r1", "r2"]


def test_cookie_pins_requests_to_one_replica(hall):
    r1, r2 = boot_id("r1"), boot_id("r2")
    assert r1 != r2  # two processes
    assert {boot_id("r1") for _ in range(5)} == {r1}  # the cookie, not the client's IP, picks the replica
    assert {boot_id("r2") for _ in range(5)} == {r2}
    # A browser without a cookie gets one that names a replica, out of reach of page scripts.
    with urllib.request.urlopen(BASE + "/", timeout=10) as r:
        cookie = r.headers.get("Set-Cookie", "")
    assert cookie.startswith("ATTNLAB=r") and "HttpOnly" in cookie


def test_a_killed_replica_sessions_come_back_with_their_view(hall):
    """6 sessions (own sentence, one head switch each), all from one IP; kill the replica holding most of
    them (SIGKILL, sessions open); each must run again on the live replica with its URL's view within 10 s."""
    out = load.run_class(BASE, sessions=6, clicks=1, browsers=2, drill=True, port=PORT, tour=False)
    results, drill = out["results"], out["drill"]
    sessions = load.results_sessions(results)
    errors = [e for r in results for e in r["errors"]]
    foreign = [f for r in results for f in r["foreign"]]
    assert len(sessions) == 6
    assert not errors, errors
    assert not foreign, foreign  # no session ever showed another's sentence, before or after the kill
    on = {r: sum(s["replica"] == r for s in sessions) for r in ("r1", "r2")}
    assert on["r1"] and on["r2"], f"affinity by cookie spreads one IP's sessions over both replicas: {on}"
    hit = [s for s in sessions if s["replica"] == drill.victim]
    assert hit
    for s in hit:
        assert s["recovered"] is not None, "no new script run after the kill"
        assert s["problem"] is None, s["problem"]
        assert s["recovered"] <= load.RECOVER_S, f"back after {s['recovered']:.1f} s"
        assert s["now_on"] != drill.victim
    assert not port_open(PORT + 10 + int(drill.victim[1:]))  # the kill was real


def test_warm_up_imports_pandas_before_sessions_draw():
    """A fresh replica under a class: a session importing pandas (st.dataframe) while another drew a heatmap
    failed ("partially initialized module 'pandas'": plotly looks pandas up in sys.modules without the import
    lock). The warm-up imports it first, so no session imports it concurrently."""
    import subprocess

    code = ("import sys; from viz.ui import warmup; warmup.warm(); p = sys.modules.get('pandas'); "
            "print('pandas ready' if p is not None and hasattr(p, 'Series') else 'pandas missing')")
    # pandas comes first, before the toy models and SmolLM2: SmolLM2 and its analyses are left out (a minute)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ATTENTION_LAB_WARM_LM": "0"})
    assert out.stdout.strip().endswith("pandas ready"), out.stdout + out.stderr[-2000:]


def test_down_stops_everything(hall):
    pids = load.replica_pids(PORT)
    load.hall("down", PORT)
    assert not any(port_open(p) for p in (PORT, PORT + 11, PORT + 12))
    for pid in pids.values():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
