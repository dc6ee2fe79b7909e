"""Real transformers in Equinox: GPT-2, GPT-Neo, BERT, ALBERT and Llama-family
decoders, loaded from HuggingFace safetensors or gguf files without torch, run
far past their depth (paper 001 §6.2), and viewed layer by layer in the
simulator's terms. A tour: docs/usage/models.md.

```python
model = ja.models.load("path/to/folder")         # or a .gguf file, or a hub name
ids, mask = model.tokenize(["a prompt", "a longer prompt"], pad="auto", return_mask=True)
E = ja.models.loop(model, ids, passes=20, mask=mask)  # padding kept out of the dynamics
dyn = ja.models.attention_dynamics(model, 3)     # layer 3 as a ja.SelfAttentionDynamics
```
"""

from ._arch import FAMILIES as FAMILIES
from ._arch import GPT2 as GPT2
from ._arch import AbstractTransformer as AbstractTransformer
from ._arch import Albert as Albert
from ._arch import Bert as Bert
from ._arch import GPTNeo as GPTNeo
from ._arch import Llama as Llama
from ._arch import TransformerConfig as TransformerConfig
from ._arch._nn import Attention as Attention
from ._checks import check_ids as check_ids
from ._checks import default_chunk as default_chunk
from ._checks import depths_refusal as depths_refusal
from ._checks import too_long as too_long
from ._gguf import file_sha256 as file_sha256
from ._load import init as init
from ._load import load as load
from ._load import resolve_config as resolve_config
from ._load import weight_files as weight_files
from ._loop import WEIGHTS as WEIGHTS
from ._loop import hidden_states as hidden_states
from ._loop import iterate_loop as iterate_loop
from ._loop import logits as logits
from ._loop import loop as loop
from ._loop import loop_program as loop_program
from ._loop import predict as predict
from ._loop import setup_loop as setup_loop
from ._packaged import PACKAGED as PACKAGED
from ._packaged import packaged_path as packaged_path
from ._patterns import attention_patterns as attention_patterns
from ._patterns import run_with_cache as run_with_cache
from ._presets import ALIASES as ALIASES
from ._presets import PRESETS as PRESETS
from ._tokenize import detokenize as detokenize
from ._tokenize import read_prompts as read_prompts
from ._tokenize import tokenize as tokenize
from ._tokenize import tokenizer_source as tokenizer_source
from ._weights import attention_dynamics as attention_dynamics
from ._weights import attention_weights as attention_weights
from ._weights import layer_weights as layer_weights
from ._weights import replace_attention as replace_attention
from ._weights import value_output as value_output
