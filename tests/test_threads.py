"""A session that trains changes nothing another session sees (issue #12 §3).

Streamlit serves every browser session from a thread of one process: training in one must not
change the thread count, the global RNG, or the numbers another session's trace computes.
"""

from __future__ import annotations

import threading

import pytest
import torch

from model import load_checkpoint
from model.toy.train import train

TINY = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64, "dropout": 0.1}


def _trace():
    # A fresh load each time: building the model draws from torch's global generator, as another
    # session may while one trains; the training run must not notice (its dropout is private).
    return load_checkpoint("dates").trace("3 november 2023", names=["*.weights", "logits"])[1]


@pytest.mark.slow
def test_training_in_one_thread_while_another_traces():
    reference = _trace()  # before anyone trains
    threads = torch.get_num_threads()
    solo = train("reverse", TINY, steps=20, batch_size=8, film_every=0, eval_n=0)

    training = threading.Event()
    seen_threads: list[int] = []
    traces = []
    result = {}

    def on_step(step, m):
        training.set()
        seen_threads.append(torch.get_num_threads())
        return None

    def trainer():
        result["ckpt"] = train("reverse", TINY, steps=20, batch_size=8, film_every=0, eval_n=0, callback=on_step)

    t = threading.Thread(target=trainer)
    t.start()
    assert training.wait(60), "training did not start"
    while t.is_alive():  # trace as often as we can while the other thread trains
        traces.append(_trace())
        seen_threads.append(torch.get_num_threads())
    t.join()

    assert traces, "no trace ran during training"
    for tr in traces:  # bit-identical to the trace taken before anyone trained
        assert tr.names() == reference.names()
        assert all(torch.equal(tr[n], reference[n]) for n in reference)
    assert set(seen_threads) == {threads} and torch.get_num_threads() == threads
    # and the concurrent run is the run it would have been alone
    assert result["ckpt"].log["loss"] == solo.log["loss"]
