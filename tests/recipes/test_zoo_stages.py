"""The recipe's stages: vision pretraining, then language with the tower frozen, then tuned."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2_5_VLForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlens.cli import main
from vlens.recipes.embedded.batches import collate, collate_text, encode_example, patchify, to_model_image
from vlens.recipes.embedded.probe import fit_linear_probe, fit_softmax_regression
from vlens.recipes.embedded.recipe import build_untrained
from vlens.recipes.embedded.train import image_tokens, linear_patch_embedding
from vlens.recipes.embedded.training_set import source_makers

TINY = (
    "--image-size 56 --examples 8 --batch-size 2 --steps 4 --warmup 1 --held-out 1 "
    "--probe-scenes 6 --checkpoint-every 2 --log-every 1 --threads 1 --quiet"
).split()


def _batch(processor, size: int, n: int = 3):
    makers = source_makers(vary=False)
    samples = [makers["shape"](seed) for seed in range(n)]
    images = torch.from_numpy(np.stack([to_model_image(image, size) for image, _ in samples]))
    examples = [encode_example(processor, r["question"], r["answer"], i) for i, (_, r) in enumerate(samples)]
    return examples, images


def test_cached_image_tokens_give_the_same_loss_as_pixels():
    tokenizer, processor, model = build_untrained(seed=3, image_size=112)
    model.eval()
    examples, images = _batch(processor, 112)
    ids = (tokenizer.pad_token_id, processor.image_token_id)
    with torch.no_grad():
        from_pixels = model(**collate(examples, images, *ids)).loss
        tokens = image_tokens(model, images)  # [3, 16, width]
        batch = collate_text(examples, *ids, grid=tokens.shape[1])
        cached = model(
            **batch,
            mm_encoder_outputs={
                "image": BaseModelOutputWithPooling(pooler_output=[tokens.reshape(-1, tokens.shape[-1])])
            },
        ).loss
    torch.testing.assert_close(cached, from_pixels, rtol=0, atol=1e-5)


def test_linear_patch_embedding_equals_the_conv_and_is_restored_on_error():
    _, processor, model = build_untrained(seed=4, image_size=56)
    _, images = _batch(processor, 56)
    pixel_values, _ = patchify(images)
    embed = model.model.visual.patch_embed
    reference = embed(pixel_values)
    with linear_patch_embedding(model.model.visual):
        torch.testing.assert_close(embed(pixel_values), reference, rtol=0, atol=1e-5)
    with pytest.raises(RuntimeError), linear_patch_embedding(model.model.visual):
        raise RuntimeError("boom")
    assert "forward" not in vars(embed)  # the class's Conv3d forward again


def test_linear_probe_separates_what_is_linear_and_not_noise():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 5, generator=generator)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()  # 4 classes, linearly separable
    assert fit_linear_probe(x[:200], y[:200], x[200:], y[200:]) > 0.9
    noise = torch.randint(4, (300,), generator=generator)
    assert fit_linear_probe(x[:200], noise[:200], x[200:], noise[200:]) < 0.5


def test_softmax_regression_predicts_every_class_even_one_absent_from_training():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(400, 3, generator=generator) * torch.tensor([1.0, 100.0, 0.01])  # scales the fit standardises
    y = (x[:, 0] > 0).long()
    predict = fit_softmax_regression(x[:300], y[:300], n_classes=4)
    logits = predict(x[300:])
    assert logits.shape == (100, 4)
    assert (logits.argmax(-1) == y[300:]).float().mean() > 0.95
    assert set(logits.argmax(-1).tolist()) <= {0, 1}  # classes 2 and 3 never seen, never predicted


def test_vision_then_frozen_then_tuned_stages(tmp_path):
    vision, frozen, tuned = tmp_path / "vision", tmp_path / "frozen", tmp_path / "tuned"
    assert main(["zoo", "train", "--stage", "vision", "--out", str(vision), "--seed", "1", *TINY]) == 0
    summary = json.loads((vision / "evaluation.json").read_text())
    assert summary["evaluation"] == {} and summary["training"]["stage"] == "vision"
    assert {"shape_cell_accuracy", "colour_cell_accuracy", "count_accuracy"} <= set(
        summary["training"]["dense"]
    )
    card = (vision / "MODEL_CARD.md").read_text()
    assert "vision pretraining: the tower and merger alone" in card and "| 1 | vision pretraining |" in card
    assert "Weights in this folder: stage 1 of 1 (vision pretraining," in card
    untrained = build_untrained(seed=1, image_size=56)[2].state_dict()
    pretrained = Qwen2_5_VLForConditionalGeneration.from_pretrained(vision).state_dict()
    for name, tensor in pretrained.items():  # the decoder as initialised, the tower trained
        assert torch.equal(tensor, untrained[name]) == (not name.startswith("model.visual.")), name
    weights = load_file(vision / "model.safetensors")  # the saved file's names: "visual.*" is the tower

    argv = ["zoo", "train", "--out", str(frozen), "--seed", "2", "--init-from", str(vision), *TINY]
    assert main([*argv, "--freeze-vision"]) == 0
    frozen_weights = load_file(frozen / "model.safetensors")
    for (
        name,
        tensor,
    ) in frozen_weights.items():  # the tower and merger exactly as pretrained, the rest trained
        assert torch.equal(tensor, weights[name]) == name.startswith("visual."), name
    frozen_summary = json.loads((frozen / "evaluation.json").read_text())
    assert frozen_summary["training"]["probe"] == summary["training"]["probe"]  # same tower, same probe

    argv = ["zoo", "train", "--out", str(tuned), "--seed", "3", "--init-from", str(frozen), *TINY]
    assert main(argv) == 0
    tuned_weights = load_file(tuned / "model.safetensors")
    assert not torch.equal(
        tuned_weights["visual.blocks.0.mlp.down_proj.weight"],
        weights["visual.blocks.0.mlp.down_proj.weight"],
    )
    card = (tuned / "MODEL_CARD.md").read_text()
    assert (
        "| 1 | vision pretraining |" in card
        and "| 2 | language, tower frozen |" in card
        and "| 3 | language |" in card
    )
    assert "Weights in this folder: stage 3 of 3 (language," in card  # which stage ships
    commands = [line for line in card.splitlines() if line.startswith("vlens zoo train")]
    assert len(commands) == 3 and commands[0].startswith(
        "vlens zoo train --out stage1 --stage vision --seed 1"
    )
    assert "--freeze-vision" in commands[1] and commands[1].endswith("--image-size 56 --init-from stage1")
    assert "--freeze-vision" not in commands[2] and commands[2].endswith("--init-from stage2")
    assert "Held-out accuracy (greedy generation" in card

    # --freeze-vision belongs to language stages
    assert (
        main(["zoo", "train", "--stage", "vision", "--out", str(tmp_path / "x"), "--freeze-vision", *TINY])
        == 2
    )
