"""Starting a run from a model you have (`--init-from`): the base's architecture and weights, its vocabulary
extended for the characters of the new text it lacks, its context shortened where asked.

The new characters get ids after the base's (old ids unchanged) and rows in the token embedding and `lm_head`
made by transformers' own `resize_token_embeddings(mean_resizing=True)`: the mean of the old rows (sampled with the
old rows' covariance scaled by 1e-9, so in effect the mean), and for `lm_head`'s bias the mean of the old biases.
The old characters' logits over the old ids are then those of the base; a new character starts as likely as an
average old one. A shorter `block_size` keeps the first positions the base learned.
"""

from __future__ import annotations

import logging

from gpt_serve import CharGPTConfig, CharGPTForCausalLM
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.generation import load_backend

from .preflight import BaseModel

logger = logging.getLogger(__name__)

POSITIONS_KEY = "model.position_embedding_table.weight"


def load_base(base: BaseModel) -> CharGPTForCausalLM:
    """The base's model, loaded with every check `load_backend` makes of a folder (its weights all there, in the
    right shapes, finite)."""
    return load_backend(base.source, "torch").backend.pretrained


def model_from_base(base: BaseModel, vocab: CharVocab, block_size: int, dropout: float | None = None):
    """A `CharGPTForCausalLM` with the base's weights, `vocab` (the base's characters first) and `block_size` (at
    most the base's), in training mode; `dropout` None keeps the base's."""
    model = load_base(base)
    added = len(vocab) - model.config.vocab_size
    assert added >= 0 and vocab.chars[: model.config.vocab_size] == base.vocab.chars, "old ids must stay"
    if added:
        from transformers.utils import logging as transformers_logging

        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # its note on mean resizing: our log line says it below
        try:
            model.resize_token_embeddings(len(vocab), mean_resizing=True)  # draws from torch's global RNG
        finally:
            transformers_logging.set_verbosity(verbosity)
        logger.info(
            "%s lacks %d character%s of the text (%s): new ids %d-%d, their embedding and lm_head rows start at the "
            "mean of the base's",
            base.name,
            added,
            "s" if added > 1 else "",
            ", ".join(map(repr, vocab.chars[-added:][:10])) + (", ..." if added > 10 else ""),
            len(vocab) - added,
            len(vocab) - 1,
        )
    state = model.state_dict()
    state[POSITIONS_KEY] = state[POSITIONS_KEY][:block_size]
    settings = {**model.config.to_dict(), "vocab_size": len(vocab), "vocab_sha256": vocab.sha256}
    settings["block_size"] = block_size
    if dropout is not None:
        settings["dropout"] = dropout
    out = CharGPTForCausalLM(CharGPTConfig.from_dict(settings))
    out.load_state_dict(state)
    return out.train()
