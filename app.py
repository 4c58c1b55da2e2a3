"""Attention Lab: type a sentence, watch a Transformer think.  `streamlit run app.py`

A thin entry point: the shared sidebar (model + input, chosen once for every page) and
`st.navigation` over file pages (AppTest.switch_page reaches file pages only).
"""

from pathlib import Path

import streamlit as st

from viz import common

ROOT = Path(__file__).parent
DEFAULT = "viz/pages/attention.py"  # opens at "/": the view that shows a Transformer thinking
PAGES = [  # (file, title, icon); pages written elsewhere appear once their file exists
    ("viz/pages/tokens.py", "Tokens & embeddings", ":material/text_fields:"),
    ("viz/pages/attention.py", "Attention", ":material/grid_view:"),
    ("viz/pages/decoder.py", "Step-by-step decoder", ":material/step:"),
    ("viz/pages/schedule.py", "Learning-rate schedule", ":material/show_chart:"),
    ("viz/pages/training.py", "Training, live", ":material/model_training:"),
    ("viz/pages/snapshots.py", "Snapshots", ":material/photo_camera:"),
    ("viz/pages/pretrained.py", "Pretrained encoder", ":material/psychology:"),
]

st.set_page_config(page_title="Attention Lab", page_icon=":material/grid_view:", layout="wide")
pages = [st.Page(f, title=t, icon=i, default=(f == DEFAULT)) for f, t, i in PAGES if (ROOT / f).is_file()]
page = st.navigation(pages)
common.sidebar()
page.run()
