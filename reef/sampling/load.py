"""The one model loader: a model folder, a recipe's candidate folder (`Candidate.weights_of`: a LoRA
candidate runs on the base model its lineage names), or a base model with an adapter; for sampling
or for training."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reef.registry.schema import Candidate


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)


def load_model(path: Path | str, adapter: Path | str | None = None, *, trainable: bool = False,
               dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model in `path` and its tokenizer. A LoRA candidate folder (given without `adapter`) is
    loaded as its base model with itself as the adapter. For sampling (the default) the adapter is
    merged in and the model is in eval mode; `trainable` keeps the adapter a trainable PEFT model."""
    path = Path(path)
    if adapter is None:
        path, adapter = Candidate.weights_of(path)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if adapter is not None:
        from peft import PeftModel

        peft = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
        # A PeftModel forwards what it does not define to the model it wraps.
        model = cast(PreTrainedModel, peft) if trainable else cast(PreTrainedModel, peft.merge_and_unload())
    return (model if trainable else model.eval()), load_tokenizer(path)


def load_gguf(file: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A GGUF checkpoint dequantized into a plain transformers model that `save_pretrained` accepts.

    transformers refuses to save a model loaded from GGUF (it counts as quantized), so the weights
    move into a fresh model built from the same config without the quantization entry."""
    file = Path(file)
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = loaded.state_dict()
    del loaded
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.eval(), tokenizer
