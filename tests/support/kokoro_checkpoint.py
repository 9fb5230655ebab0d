"""A randomly initialised Kokoro checkpoint in the `kokoro` package's format.

The real Kokoro-82M `.pth` lives on the Hugging Face hub only, so the torch engine is tested on
one generated here: the same files (config.json, a .pth of per-component state dicts saved with
DataParallel's `module.` prefixes, voices/*.pt tensors), the real vocab, fewer and narrower
layers where KModel lets them shrink (the decoder's widths are fixed), and short durations.
The audio is noise, but its length, format and the code path that loads it are the real ones.

`full_config()` has Kokoro-82M's own shapes (81.8 M parameters, every tensor the shape of the
registry's int8 model's) and `frames_per_token` fixes the predicted durations, so a GPU's speed
can be measured without the real weights (scripts/gpu-check with KOKORO_MODEL_DIR=random):
the time of a forward pass depends on the shapes and the number of frames, not on the values.

    python -m tests.support.kokoro_checkpoint DIR [--full] [--frames-per-token N]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model_server.engines.checkpoint import COMPONENTS
from model_server.engines.weights import load_vocab

SAMPLES_PER_FRAME = 600  # 2 (decoder upsample) x 10 x 6 (upsample rates) x 5 (iSTFT hop)
VOICE = "af_tiny"

TINY_CONFIG: dict[str, Any] = {
    "istftnet": {
        "upsample_kernel_sizes": [20, 12],
        "upsample_rates": [10, 6],
        "gen_istft_hop_size": 5,
        "gen_istft_n_fft": 20,
        "resblock_dilation_sizes": [[1, 3, 5]],
        "resblock_kernel_sizes": [3],
        "upsample_initial_channel": 512,
    },
    "dim_in": 64,
    "dropout": 0.2,
    "hidden_dim": 512,
    "max_conv_dim": 512,
    "max_dur": 8,
    "multispeaker": True,
    "n_layer": 1,
    "n_mels": 80,
    "n_token": 178,
    "style_dim": 128,
    "text_encoder_kernel_size": 5,
    "plbert": {
        "hidden_size": 64,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "num_hidden_layers": 1,
        "dropout": 0.1,
    },
}


# Kokoro-82M's config.json, less the vocab (load_vocab gives the same one)
KOKORO_82M_CONFIG: dict[str, Any] = {
    **TINY_CONFIG,
    "istftnet": {
        **TINY_CONFIG["istftnet"],
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "resblock_kernel_sizes": [3, 7, 11],
    },
    "max_dur": 50,
    "n_layer": 3,
    "plbert": {
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 2048,
        "max_position_embeddings": 512,
        "num_hidden_layers": 12,
        "dropout": 0.1,
    },
}
# The registry's model gives the bench's 5-sentence answer 2.6 frames per phoneme (jm_kumo).
REAL_FRAMES_PER_TOKEN = 3


def tiny_config() -> dict[str, Any]:
    return {**TINY_CONFIG, "vocab": load_vocab()}


def full_config() -> dict[str, Any]:
    return {**KOKORO_82M_CONFIG, "vocab": load_vocab()}


def write_checkpoint(
    directory: Path,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    frames_per_token: int | None = None,
) -> dict[str, Any]:
    """Write config.json, kokoro-v1_0.pth and voices/af_tiny.pt; returns the state dicts.

    `frames_per_token`: every token (pads too) lasts exactly this many frames (the duration
    head's weights zeroed, that many of its bins always on); None keeps the random durations."""
    import torch
    from kokoro import KModel

    config = config or tiny_config()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "voices").mkdir(exist_ok=True)
    empty = directory / "empty.tmp"
    torch.save({}, empty)  # KModel always loads a checkpoint; an empty one keeps its random init
    torch.manual_seed(seed)
    model = KModel(repo_id="hexgrad/Kokoro-82M", config=config, model=str(empty))
    empty.unlink()
    if frames_per_token is not None:
        head = model.predictor.duration_proj.linear_layer
        if not 1 <= frames_per_token <= head.out_features:
            raise ValueError(f"frames_per_token must be 1..{head.out_features}")
        with torch.no_grad():  # sigmoid(+-30) is 1 or 0 to float32's precision
            head.weight.zero_()
            head.bias.fill_(-30.0)
            head.bias[:frames_per_token] = 30.0
    state = {
        component: {f"module.{k}": v for k, v in getattr(model, component).state_dict().items()}
        for component in COMPONENTS
    }
    torch.save(state, directory / "kokoro-v1_0.pth")
    (directory / "config.json").write_text(json.dumps(config, ensure_ascii=False))
    torch.save(0.1 * torch.randn(510, 1, 256), directory / "voices" / f"{VOICE}.pt")
    return state


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="write a random Kokoro checkpoint")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--full", action="store_true", help="Kokoro-82M's shapes (81.8 M)")
    parser.add_argument("--frames-per-token", type=int)
    args = parser.parse_args()
    config = full_config() if args.full else tiny_config()
    write_checkpoint(args.directory, config, frames_per_token=args.frames_per_token)
    print(f"{args.directory}: {'Kokoro-82M shapes' if args.full else 'tiny'}, voice {VOICE}")


if __name__ == "__main__":
    main()
