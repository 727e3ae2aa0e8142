import os
import tempfile

import pytest
import torch

# The uncompiled FlexAttention path keeps the suite fast (the default on CPU); one test compiles it.
os.environ.setdefault("POSENC_FLEX_COMPILE", "0")
# Attention forms timed in the suite are remembered in its own file, never in the user's cache.
os.environ["POSENC_FORMS_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="posenc-forms-"), "attention-forms.json")


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
