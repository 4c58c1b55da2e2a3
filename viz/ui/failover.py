"""A tab whose server died comes back on a live one, with the view its URL holds (deploy/, issue 20 §2).

Behind HAProxy (deploy/haproxy.cfg) a killed replica's tabs reconnect their WebSocket by themselves and
the proxy redispatches them to a live replica. But Streamlit's frontend then asks for no script run: it
assumes the server kept its session (App.handleConnectionStateChanged requests a rerun only on a first
connection), so the tab would keep showing a stale page, served by no one, until its next click.

So every replica has a boot id, served at `_al/replica` beside Streamlit's own routes, and each page
records the boot id of the replica that drew it. A small script wraps `WebSocket`: when Streamlit's
stream opens again (a reconnect), it asks `_al/replica` through the same proxy (same cookie, so the
same replica as the new WebSocket); a different boot id means the session is gone, and the page
reloads: the new replica runs the script from the URL, which holds the view (issue 13). A reconnect to
the replica that still holds the session (a network hiccup) changes nothing, so nothing is lost.
"""

from __future__ import annotations

import uuid

import streamlit as st

BOOT = uuid.uuid4().hex  # this server process; `streamlit run` imports this module once per process
ROUTE = "/_al/replica"

_SCRIPT = """<script>
(() => {
  window.__alBoot = "%s";  // the replica that drew this page
  if (window.__alFailover) return;
  window.__alFailover = true;
  const Native = window.WebSocket;
  const check = (url) => {
    const probe = new URL(String(url).replace(/\\/_stcore\\/stream.*$/, "%s"));
    probe.protocol = probe.protocol === "wss:" ? "https:" : "http:";
    fetch(probe, {cache: "no-store", credentials: "same-origin"})
      .then((r) => (r.ok ? r.text() : null))
      .then((boot) => { if (boot && boot.trim() !== window.__alBoot) location.reload(); })
      .catch(() => {});  // the server is still down: the next reconnect asks again
  };
  // Streamlit's stream sockets created from now on are reconnects (the first one predates this script).
  window.WebSocket = new Proxy(Native, {
    construct(target, args) {
      const ws = Reflect.construct(target, args);
      if (String(args[0]).includes("/_stcore/stream")) ws.addEventListener("open", () => check(args[0]));
      return ws;
    },
  });
})();
</script>"""


def install() -> None:
    """Draw the reconnect check (an invisible script in the sidebar); app.py calls it once per run."""
    st.sidebar.html(_SCRIPT % (BOOT, ROUTE), unsafe_allow_javascript=True)


def routes() -> list:
    """The boot-id route for `st.App(routes=...)`: tiny, uncached, no session needed."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def replica(request) -> PlainTextResponse:  # noqa: ARG001 - Starlette passes the request
        return PlainTextResponse(BOOT, headers={"Cache-Control": "no-store"})

    return [Route(ROUTE, replica)]
