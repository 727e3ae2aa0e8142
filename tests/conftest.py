import os

import pytest
import torch

# The uncompiled FlexAttention path keeps the suite fast (the default on CPU); one test compiles it.
os.environ.setdefault("POSENC_FLEX_COMPILE", "0")


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
