"""The verification core: pure torch functions deciding which drafted tokens are kept, and recording
for every emitted token how it was produced (provenance), its target and behaviour log-probs, and the
target's margin ratio.  No model code, no Ray, no config objects; randomness only from a caller's
``torch.Generator``.  ``reference.py`` holds slow loop-based oracles used by the tests.
"""

from .chain import Rule, verify_chain
from .dist import sampling_logits
from .sample import sample_plain
from .tree import verify_tree
from .types import DEFAULT_THETA, Provenance, TreeVerifyResult, VerifyResult

RULES: tuple[str, ...] = ("strict", "mars", "mars_code")

__all__ = [
    "DEFAULT_THETA",
    "RULES",
    "Provenance",
    "Rule",
    "TreeVerifyResult",
    "VerifyResult",
    "sample_plain",
    "sampling_logits",
    "verify_chain",
    "verify_tree",
]
