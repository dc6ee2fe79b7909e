"""The supported transformer families, by HuggingFace `model_type` (decoders, then
encoders: the order in which the loader tries their prefixes)."""

from .albert import Albert as Albert
from .base import AbstractTransformer as AbstractTransformer
from .base import TransformerConfig as TransformerConfig
from .bert import Bert as Bert
from .gpt2 import GPT2 as GPT2
from .gpt_neo import GPTNeo as GPTNeo
from .llama import Llama as Llama

FAMILIES: dict[str, type[AbstractTransformer]] = {
    "gpt2": GPT2,
    "gpt_neo": GPTNeo,
    "llama": Llama,
    "bert": Bert,
    "albert": Albert,
}
