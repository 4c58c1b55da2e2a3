#!/usr/bin/env bash
# Installs Debian's Chromium for tests/test_browser.py and bench/app.py (Playwright drives it
# through executable_path: Playwright's own browser download cannot reach its host here), and
# HAProxy for tests/test_hall.py (deploy/hall.sh: replicas behind a proxy), and redis-server for
# tests/test_class_store.py (the live class's Redis store, tested against a real server: without it the test fails).
set -euo pipefail
# Fonts: the zh-en model shows Chinese (wqy-zenhei) and the pages use emoji icons (noto-color-emoji);
# without them the screenshots show empty boxes where a user's browser shows glyphs.
if [ -x /usr/bin/chromium ] && [ -x /usr/sbin/haproxy ] && [ -x /usr/bin/redis-server ] && fc-list 2>/dev/null | grep -qi wqy && fc-list 2>/dev/null | grep -qi "color emoji"; then
    echo "browser-setup: $(/usr/bin/chromium --version 2>/dev/null || echo chromium) already installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core fonts-wqy-zenhei \
    fonts-noto-color-emoji haproxy redis-server >/dev/null
echo "browser-setup: installed $(/usr/bin/chromium --version 2>/dev/null)"
