import pytest
import torch
from browser_support import browser, page, paths, server  # noqa: F401  (real-browser fixtures)

from model import Transformer, TransformerConfig


def small_config(**kw) -> TransformerConfig:
    base = dict(src_vocab_size=23, tgt_vocab_size=19, d_model=32, n_heads=4, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=64)
    return TransformerConfig(**(base | kw))


@pytest.fixture
def small_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(small_config()).eval()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sources (the second padded) and two targets (the second padded)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, 23, (2, 9), generator=g)
    tgt = torch.randint(1, 19, (2, 6), generator=g)
    src[1, 6:] = 0
    tgt[1, 4:] = 0
    return src, tgt


def assert_clean(at) -> None:
    """An AppTest run showed no exception and no error message."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
