"""plotly.js's own words (the chart toolbar's tooltips, its download notices) in the UI's language.

plotly.js looks each of these English strings up in `config.locales[config.locale].dictionary`; the app
passes that dictionary with every chart (viz.ui.render.plotly_config), filled from the catalogs, so no locale
bundle needs registering in the browser. The strings are plotly.js's (2.x/3.x modebar and notifier), exactly.
"""

from __future__ import annotations

from viz.i18n import N_, t

LOCALES = {"zh": "zh-CN"}  # the app's language -> plotly's locale name

PLOTLY_WORDS = (
    N_("Autoscale"), N_("Box Select"), N_("Compare data on hover"), N_("Download plot as a PNG"),
    N_("Download plot"), N_("Download plot as JSON"), N_("Draw circle"), N_("Draw closed freeform"),
    N_("Draw line"), N_("Draw open freeform"), N_("Draw rectangle"), N_("Erase active shape"),
    N_("Image download succeeded"), N_("Lasso Select"), N_("Orbital rotation"), N_("Pan"),
    N_("Preparing image - this may take a few seconds"), N_("Reset axes"), N_("Reset camera to default"),
    N_("Reset camera to last save"), N_("Reset view"), N_("Reset views"), N_("Show closest data on hover"),
    N_("Sorry, there was a problem downloading your image!"), N_("Toggle Spike Lines"),
    N_("Toggle show closest data on hover"), N_("Turntable rotation"), N_("Zoom in"), N_("Zoom out"),
    N_("Double-click to zoom back out"), N_("Reset"), N_("Zoom"),
)


def locale_config(lang: str) -> dict:
    """The plotly config keys that put its toolbar in `lang` ({} for English)."""
    name = LOCALES.get(lang)
    if name is None:
        return {}
    words = {w: t(w, lang=lang) for w in PLOTLY_WORDS}
    return {"locale": name, "locales": {name: {"dictionary": {k: v for k, v in words.items() if v != k}}}}
