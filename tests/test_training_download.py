"""A model trained in the browser lives only in its session: the Training page offers it as one file
(safetensors + JSON in the header), `load_checkpoint(path)` reads that file, and uploading it brings the
model back into the session's model list. Foreign, corrupt and pickle files are refused with a message.
"""

from __future__ import annotations

import pickle
import zipfile
from io import BytesIO
from pathlib import Path

import pytest
import torch
from conftest import assert_clean, open_page

from model import Trace
from model.toy.checkpoint import (
    CheckpointFileError,
    load_checkpoint,
    load_checkpoint_file,
    save_checkpoint_file,
)

TRAINING = "viz/pages/training.py"


@pytest.fixture(scope="module")
def reverse():
    return load_checkpoint("reverse")


@pytest.fixture(scope="module")
def model_path(reverse, tmp_path_factory) -> Path:
    return save_checkpoint_file(reverse, tmp_path_factory.mktemp("file") / "my-model.safetensors")


def test_one_file_round_trip_is_exact(reverse, model_path):
    back = load_checkpoint(str(model_path))  # the public entry point reads the one-file format
    mine, theirs = reverse.model.state_dict(), back.model.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert back.cfg == reverse.cfg and back.meta == reverse.meta and back.log == reverse.log
    assert back.src_tokenizer.vocab_size == reverse.src_tokenizer.vocab_size
    # Tied weights stay tied (one tensor in the file, aliases restored).
    assert back.model.state_dict(keep_vars=True).keys() == reverse.model.state_dict(keep_vars=True).keys()
    film, film_back = reverse.film(), back.film()
    assert [s for s, _ in film] == [s for s, _ in film_back] and film
    last, last_back = film[-1][1], film_back[-1][1]
    assert last.names() == last_back.names() and all(torch.equal(last[n], last_back[n]) for n in last.names())
    probe = reverse.meta["probe"]["source"]
    assert back.translate(probe).text == reverse.translate(probe).text
    assert back.path is None and back.name == reverse.meta.get("name", "my-model")
    assert model_path.read_bytes()[:8] != b"PK\x03\x04"  # one safetensors file, not an archive


def write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "upload.safetensors"
    p.write_bytes(data)
    return p


def zip_bytes() -> bytes:
    buf = BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": [1.0]}))
    return buf.getvalue()


@pytest.mark.parametrize("what, kind", [("empty", "empty"), ("pickle", "pickle"), ("zip", "zip"),
                                        ("trace", "foreign"), ("weights", "foreign"), ("truncated", "corrupt"),
                                        ("text", "corrupt")])
def test_other_files_are_refused_before_any_tensor_is_read(reverse, model_path, tmp_path, what, kind):
    if what == "trace":
        _, tr = reverse.trace("abc", names="*.weights")
        data = tr.to_bytes()
    elif what == "weights":  # the directory format's model.safetensors alone
        reverse.save(tmp_path / "dir")
        data = (tmp_path / "dir" / "model.safetensors").read_bytes()
    else:
        data = {"empty": b"", "pickle": pickle.dumps({"w": [1.0]}, protocol=4), "zip": zip_bytes(),
                "truncated": model_path.read_bytes()[:-100], "text": b"hello, this is not a model" * 3}[what]
    with pytest.raises(CheckpointFileError) as e:
        load_checkpoint_file(write(tmp_path, data), label="their.safetensors")
    assert e.value.kind == kind
    assert "their.safetensors" in str(e.value)


def test_a_forged_file_table_never_chooses_a_path(reverse, model_path, tmp_path):
    """The header's file table names files; only the format's own names are written, never a path."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(model_path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    files = json.loads(meta["files"])
    files["../../escaped.json"] = "{}"
    meta["files"] = json.dumps(files)
    save_file(tensors, str(tmp_path / "forged.safetensors"), metadata=meta)
    back = load_checkpoint(str(tmp_path / "forged.safetensors"))
    assert back.translate("abc").text == reverse.translate("abc").text
    assert not (tmp_path.parent / "escaped.json").exists()


# ---------------------------------------------------------------- the page


class FakeJob:
    """A finished training job as the page reads it (no thread)."""

    def __init__(self, ckpt, steps: int = 10, task: str = "reverse"):
        self.task, self.steps, self.warmup, self.ckpt, self.error = task, steps, 5, ckpt, None
        self.log = {"step": list(range(1, steps + 1)), "loss": [2.0] * steps, "acc": [1.0] * steps,
                    "lr": [1e-3] * steps}
        self.frames, self.elapsed, self.done = [], 1.0, True

    snapshot = lambda self: self.log  # noqa: E731
    steps_done = property(lambda self: len(self.log["step"]))
    model_name = property(lambda self: f"trained: {self.task} (step {self.steps_done})")


def test_a_trained_model_is_offered_as_a_download(reverse):
    at = open_page(TRAINING, state={"train_job": FakeJob(reverse)}, timeout=240)
    assert_clean(at)
    button = at.get("download_button")
    assert [b.proto.label for b in button] == ["Download your model (.safetensors)"]
    assert any("load_checkpoint(\"trained-reverse-step-10.safetensors\")" in c.value for c in at.caption)


def test_uploading_the_file_brings_the_model_back(model_path):
    at = open_page(TRAINING, timeout=240)
    assert_clean(at)
    assert not at.session_state["session_models"] if "session_models" in at.session_state else True
    at.file_uploader(key="train_upload").set_value(("my-model.safetensors", model_path.read_bytes(),
                                                    "application/octet-stream"))
    at.run()
    assert_clean(at)
    models = at.session_state["session_models"]
    assert list(models) == ["uploaded: my-model"]
    assert "uploaded: my-model" in at.sidebar.selectbox(key="checkpoint").options  # the sidebar lists it
    assert at.success and "uploaded: my-model" in at.success[0].value
    at.sidebar.selectbox(key="checkpoint").set_value("uploaded: my-model")
    at.run()  # the model serves this page like any other: its film strip is drawn
    assert_clean(at)
    assert at.get("plotly_chart")


# In zh, AppTest cannot run the Training page a second time (any widget change or upload): it looks the
# film's translated select labels up in English ("'cross-attention (decoder → encoder)' is not in list"),
# with a shipped model and no upload too. So the zh wording is checked in the catalog instead.


def test_every_refusal_has_its_zh_wording():
    import ast

    from viz.i18n import catalog

    # The page's table, read from its source (importing a page module runs the page).
    src = (Path(__file__).resolve().parents[1] / TRAINING).read_text(encoding="utf-8")
    table = next(n.value for n in ast.walk(ast.parse(src))
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "MODEL_REFUSALS")
    refusals = {k.value: v.args[0].value for k, v in zip(table.keys, table.values, strict=True)}
    assert set(refusals) == {"empty", "pickle", "zip", "foreign", "too_many_names"}
    zh = catalog("zh")
    assert all("{name}" in zh[msg] for msg in refusals.values())
    assert "从不打开" in zh[refusals["pickle"]]


def test_a_pickle_upload_is_refused_with_a_message():
    at = open_page(TRAINING, timeout=240)
    at.file_uploader(key="train_upload").set_value(("model.safetensors", pickle.dumps({"w": 1}, protocol=4),
                                                    "application/octet-stream"))
    at.run()
    assert not at.exception
    assert any("never opens" in e.value and "model.safetensors" in e.value for e in at.error)
    assert not (at.session_state["session_models"] if "session_models" in at.session_state else {})


def test_a_trace_upload_is_refused_as_foreign(reverse):
    _, tr = reverse.trace("abc", names="*.weights")
    at = open_page(TRAINING, timeout=240)
    at.file_uploader(key="train_upload").set_value(("trace.safetensors", Trace.to_bytes(tr),
                                                    "application/octet-stream"))
    at.run()
    assert not at.exception
    assert any("not a model downloaded from this page" in e.value for e in at.error)


def test_the_zh_training_page_reruns_after_a_widget_change():
    """The film controls' labels are translated when drawn (option_labels): AppTest (and a rerun) in zh
    used to fail with "'cross-attention (decoder → encoder)' is not in list"."""
    at = open_page(TRAINING, query={"lang": "zh"}, timeout=240)
    assert_clean(at)
    kinds = [s for s in at.selectbox if s.key and s.key.endswith("_kind")]
    assert kinds, "the film's attention-kind select is drawn"
    kinds[0].set_value("self_attn").run()
    assert_clean(at)
    assert [s for s in at.selectbox if s.key == kinds[0].key][0].value == "self_attn"
