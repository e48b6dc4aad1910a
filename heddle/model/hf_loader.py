"""Loading a Hugging Face model directory: config.json + *.safetensors (+ tokenizer files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from heddle.errors import ModelLoadError
from heddle.model.spec import ModelSpec, RopeScaling
from heddle.model.tokenizer import Tokenizer

# config.json `model_type` -> family
_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def load_hf_dir(path: Path) -> tuple[ModelSpec, dict[str, torch.Tensor], Tokenizer | None]:
    config = read_config(path)
    spec = spec_from_hf_config(config, path)
    weights = read_safetensors(path)
    if "model.embed_tokens.weight" not in weights:
        raise ModelLoadError(f"{path}: no model.embed_tokens.weight in the safetensors files")
    tokenizer = Tokenizer.from_hf_dir(path) if (path / "tokenizer.json").is_file() else None
    return spec, weights, tokenizer


def read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} is not a model directory (no config.json)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {config_file}: {e}") from e
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} is not a JSON object")
    return config


def spec_from_hf_config(config: dict[str, Any], path: Path) -> ModelSpec:
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise ModelLoadError(
            f"{path}: unsupported model_type {model_type!r} (heddle runs {', '.join(_FAMILIES)})"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: unsupported hidden_act {config.get('hidden_act')!r}")
    try:
        hidden = int(config["hidden_size"])
        num_heads = int(config["num_attention_heads"])
        # transformers v5 writes `rope_parameters`; v4 wrote rope_theta + rope_scaling.
        rope = dict(config.get("rope_parameters") or {})
        rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        scaling = config.get("rope_scaling") or rope
        window = None
        if model_type == "mistral":
            window = config.get("sliding_window")
        elif config.get("use_sliding_window"):
            raise ModelLoadError(f"{path}: sliding-window Qwen models are not supported")
        return ModelSpec(
            family=_FAMILIES[model_type],
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_scaling=_rope_scaling(scaling),
            # Qwen2 always has q/k/v bias; others say so in `attention_bias`.
            attention_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_window=int(window) if window else None,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}/config.json is missing or has a bad value: {e}") from e


def _rope_scaling(scaling: dict[str, Any]) -> RopeScaling | None:
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in (None, "default"):
        return None
    if rope_type == "linear":
        return RopeScaling("linear", float(scaling["factor"]))
    if rope_type == "llama3":
        return RopeScaling(
            "llama3",
            float(scaling["factor"]),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                scaling.get("original_max_position_embeddings", 8192)
            ),
        )
    raise ModelLoadError(f"unsupported rope scaling type {rope_type!r}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The files named by model.safetensors.index.json, else every *.safetensors except a
    Mistral-format `consolidated.safetensors` next to HF-format ones."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"cannot read {index}: {e}") from e
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
        hf_format = [f for f in files if not f.name.startswith("consolidated")]
        files = hf_format or files
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"cannot read {file.name}: {e}") from e
    return weights
