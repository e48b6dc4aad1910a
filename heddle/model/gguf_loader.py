"""Loading a llama.cpp GGUF file: hyperparameters, weights (dequantized, in Hugging Face
names and layout) and the tokenizer described by its metadata."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from heddle.errors import ModelLoadError
from heddle.model.gguf_file import GGUFFile
from heddle.model.quant import BlockQuantized
from heddle.model.spec import ModelSpec, RopeScaling
from heddle.model.tokenizer import Tokenizer

# GGUF `general.architecture` -> our family. llama.cpp writes Mistral models as "llama".
_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Pre-tokenizer split patterns by `tokenizer.ggml.pre`, as transformers maps them. Types not
# listed (gpt2, smollm, ...) use the GPT-2 pattern built into ByteLevel.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED = 3, 4


def load_gguf(
    path: Path, keep_blocks: bool = False
) -> tuple[ModelSpec, dict[str, torch.Tensor], Tokenizer, dict[str, BlockQuantized]]:
    """Spec, float32 weights, tokenizer; with `keep_blocks`, also the Q4_0 / Q4_1 / Q8_0
    matrices as their own blocks (HF names, same row order as the float weights)."""
    gguf = GGUFFile(path)
    try:
        spec = spec_from_gguf(gguf)
        tokenizer = tokenizer_from_gguf(gguf)
        weights = weights_from_gguf(gguf, spec)
        blocks = blocks_from_gguf(gguf, spec) if keep_blocks else {}
    finally:
        gguf.close()
    return spec, weights, tokenizer, blocks


def spec_from_gguf(gguf: GGUFFile) -> ModelSpec:
    arch = gguf.get("general.architecture")
    if arch not in _FAMILIES:
        raise ModelLoadError(
            f"{gguf.path.name}: unsupported GGUF architecture {arch!r}"
            f" (heddle runs {', '.join(sorted(_FAMILIES))})"
        )

    def key(name: str, default: Any = None) -> Any:
        value = gguf.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{gguf.path.name}: metadata {arch}.{name} is missing")
        return value

    hidden = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // num_heads))
    rope_scaling = None
    if gguf.get(f"{arch}.rope.scaling.type") == "linear":
        rope_scaling = RopeScaling("linear", float(key("rope.scaling.factor")))
    vocab = gguf.get(f"{arch}.vocab_size") or len(gguf.get("tokenizer.ggml.tokens", []))
    if not vocab:
        vocab = gguf.tensors["token_embd.weight"].shape[0]
    window = gguf.get(f"{arch}.attention.sliding_window")
    return ModelSpec(
        family=_FAMILIES[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(key("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 4096)),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        rope_scaling=rope_scaling,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gguf.tensors,
        sliding_window=int(window) if window else None,
    )


def _hf_name(name: str) -> str | None:
    hf_name = _GLOBAL_NAMES.get(name)
    match = _LAYER_TENSOR.fullmatch(name)
    if hf_name is None and match is not None and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        hf_name = f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    return hf_name  # None: e.g. rope_freqs of other kinds; not used by the network


def _rope_heads(gguf: GGUFFile, spec: ModelSpec, hf_name: str) -> int | None:
    """llama.cpp's converter permutes the rows of q_proj/k_proj of "llama" models so that its
    RoPE can rotate adjacent pairs; we undo it (as transformers does) and rotate halves."""
    if gguf.get("general.architecture") != "llama":
        return None
    if ".q_proj." in hf_name:
        return spec.num_heads
    if ".k_proj." in hf_name:
        return spec.num_kv_heads
    return None


def weights_from_gguf(gguf: GGUFFile, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """All tensors, float32, in Hugging Face names and layouts."""
    weights: dict[str, torch.Tensor] = {}
    for name in gguf.tensors:
        if name == "rope_freqs.weight":  # llama3 rope scaling factors, one per frequency
            weights["rope_freqs"] = gguf.tensor(name)
            continue
        hf_name = _hf_name(name)
        if hf_name is None:
            continue
        tensor = gguf.tensor(name)
        heads = _rope_heads(gguf, spec, hf_name)
        if heads is not None:
            tensor = _unpermute_rope_rows(tensor, heads)
        weights[hf_name] = tensor
    if "model.embed_tokens.weight" not in weights:
        raise ModelLoadError(f"{gguf.path.name} has no token_embd.weight tensor")
    return weights


def blocks_from_gguf(gguf: GGUFFile, spec: ModelSpec) -> dict[str, BlockQuantized]:
    """The Q4_0 / Q4_1 / Q8_0 matrices as their own blocks, rows ordered as weights_from_gguf's."""
    blocks: dict[str, BlockQuantized] = {}
    for name in gguf.tensors:
        hf_name = _hf_name(name)
        quantized = gguf.blocks(name) if hf_name is not None else None
        if hf_name is None or quantized is None:
            continue
        heads = _rope_heads(gguf, spec, hf_name)
        if heads is not None:
            rows = torch.arange(quantized.shape[0]).unsqueeze(1)
            quantized = quantized.select_rows(_unpermute_rope_rows(rows, heads).squeeze(1))
        blocks[hf_name] = quantized
    return blocks


def _unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: rows [head, dim/2, 2] -> [head, 2, dim/2]."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *rest)
        .transpose(1, 2)
        .reshape(rows, *rest)
        .contiguous()
    )


def tokenizer_from_gguf(gguf: GGUFFile) -> Tokenizer:
    """A byte-level BPE tokenizer from `tokenizer.ggml.*` metadata, built as transformers does."""
    model = gguf.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(
            f"{gguf.path.name}: GGUF tokenizer type {model!r} is not supported"
            " (heddle reads byte-level BPE, 'gpt2'); load the Hugging Face directory instead"
        )
    tokens: list[str] = gguf.get("tokenizer.ggml.tokens") or []
    merges: list[str] = gguf.get("tokenizer.ggml.merges") or []
    token_types: list[int] = gguf.get("tokenizer.ggml.token_type") or []
    if not tokens:
        raise ModelLoadError(f"{gguf.path.name} has no tokenizer vocabulary")
    alphabet = set(_bytes_to_unicode().values())
    spelling = _bytes_to_unicode()
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode()): index
        for index, token in enumerate(tokens)
    }
    merge_pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        merge_pairs.append((left, right))
    backend = BackendTokenizer(BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False))
    split = _PRE_TOKENIZER_SPLITS.get(gguf.get("tokenizer.ggml.pre", ""))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) are special and matched whole; user-defined ones
    # (<think>, ...) are matched whole but are not special. A control token spelled outside
    # the byte alphabet is a llama.cpp mislabel and is skipped, as transformers does.
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _TOKEN_TYPE_CONTROL and set(token) <= alphabet
    ]
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _TOKEN_TYPE_USER_DEFINED and token in vocab
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(user_defined)

    bos = gguf.get("tokenizer.ggml.bos_token_id")
    eos = gguf.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(gguf.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(gguf.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = (["$bos"] if add_bos else []) + ["$A"] + (["$eos"] if add_eos else [])
    special = []
    if add_bos:
        special.append((tokens[bos], bos))
    if add_eos:
        special.append((tokens[eos], eos))
    if add_bos or add_eos:
        template = " ".join(
            tokens[bos] if part == "$bos" else tokens[eos] if part == "$eos" else part
            for part in single
        )
        backend.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=list(dict.fromkeys(special))
        )
    return Tokenizer(
        backend,
        bos_token_id=bos,
        eos_token_id=eos,
        chat_template=gguf.get("tokenizer.chat_template"),
        pad_token_id=gguf.get("tokenizer.ggml.padding_token_id"),
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes), strict=True))
