"""from_pretrained round trip, safe loading, and clear errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch

from vlens import HookedVLM
from vlens.core.architectures import adapter_for
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor


def test_from_pretrained_round_trip(tmp_path):
    hf = tiny_hf_model("qwen2_5_vl")
    processor = tiny_qwen_processor()
    hf.save_pretrained(tmp_path)
    processor.save_pretrained(str(tmp_path))
    assert (tmp_path / "model.safetensors").exists()
    model = HookedVLM.from_pretrained(str(tmp_path))
    assert model.processor is not None
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_from_pretrained_dtype_and_no_pickle(tmp_path):
    hf = tiny_hf_model("qwen2_vl")
    hf.save_pretrained(tmp_path)
    model = HookedVLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16, load_processor=False)
    assert model.cfg.dtype == torch.bfloat16
    # a folder with only pickled weights is refused
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((tmp_path / "config.json").read_text())
    torch.save(hf.state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises((OSError, ValueError, EnvironmentError)):
        HookedVLM.from_pretrained(str(pickled), load_processor=False)


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="Unsupported architecture 'GPT2LMHeadModel'.*supports"):
        adapter_for("GPT2LMHeadModel")
    config = json.loads(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="Unsupported architecture"):
        HookedVLM.from_pretrained(str(tmp_path))


def test_placeholder_count_mismatch_is_a_clear_error(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    kwargs = inputs.to_hf_kwargs()
    image_pos = inputs.regions.image[0]
    ids = kwargs["input_ids"].clone()
    ids[0, image_pos[0]] = model.tokenizer.convert_tokens_to_ids("red")  # one placeholder fewer
    kwargs["input_ids"] = ids
    kwargs.pop("mm_token_type_ids")
    with pytest.raises(ValueError, match="image placeholder tokens but the images need"):
        model(**kwargs)


def test_missing_image_grid_is_a_clear_error(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    kwargs = inputs.to_hf_kwargs()
    kwargs.pop("image_grid_thw")
    with pytest.raises(ValueError, match="without image_grid_thw"):
        model(**kwargs)


def test_placeholders_without_images_is_a_clear_error(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    with pytest.raises(ValueError, match="no pixel_values"):
        model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask)


def test_regions_describe_the_layout(qwen_pair):
    hf, model = qwen_pair("qwen2_5_vl")
    inputs = model.prepare(images=[[random_image(56, 84, 1), random_image(112, 56, 2)], random_image(56, 56, 3)],
                           prompts=["How many dots are there?", "red"])
    regions = inputs.regions
    assert regions.image_grid == [[(3, 2), (2, 4)], [(2, 2)]]
    assert [len(r) for r in regions.images[0]] == [6, 8]
    assert torch.all(inputs.input_ids[0, regions.image[0]] == model.cfg.image_token_id)
    assert int(regions.final[0]) == inputs.seq_len - 1 == int(regions.final[1])  # left padding
    # text + image positions cover exactly the non-padding tokens
    for row in range(2):
        covered = len(regions.text[row]) + len(regions.image[row])
        assert covered == int(inputs.attention_mask[row].sum())
    with pytest.raises(ValueError, match="2 image entries for 1 prompts|image entries"):
        model.prepare(images=[random_image(), random_image()], prompts=["a"])


# family -> (the processor class, the image processor class a hub checkpoint of the family names); the fast
# image processors need torchvision and InternVL's / SmolVLM's processors a video processor (and num2words)
HUB_PROCESSORS = {
    "llava_next": ("LlavaNextProcessor", "LlavaNextImageProcessorFast"),
    "llava_onevision": ("LlavaOnevisionProcessor", "LlavaOnevisionImageProcessorFast"),
    "gemma3": ("Gemma3Processor", "Gemma3ImageProcessorFast"),
    "internvl": ("InternVLProcessor", "GotOcr2ImageProcessorFast"),
    "idefics3": ("Idefics3Processor", "Idefics3ImageProcessorFast"),
    "smolvlm": ("SmolVLMProcessor", "SmolVLMImageProcessorFast"),
    "idefics2": ("Idefics2Processor", "Idefics2ImageProcessorFast"),
}


@pytest.mark.parametrize("layout", ["nested", "preprocessor_config"])
@pytest.mark.parametrize("family", sorted(HUB_PROCESSORS))
def test_a_folder_naming_the_hub_processor_classes_loads(family, layout, tmp_path):
    """A folder whose processor config names the classes a hub checkpoint names (HF's processor, the fast
    image processor; nested in processor_config.json or, the older layout, in preprocessor_config.json)
    loads with the PIL image processor, without torchvision, and its logits equal HF's."""
    from tests.helpers.models import build_pair

    hf, built = build_pair(family, seed=1)
    hf.save_pretrained(tmp_path)
    built.processor.save_pretrained(tmp_path)
    processor_class, image_processor_class = HUB_PROCESSORS[family]
    config = json.loads((tmp_path / "processor_config.json").read_text())
    config["processor_class"] = processor_class
    image = config["image_processor"]
    image["image_processor_type"] = image_processor_class
    if layout == "preprocessor_config":
        config.pop("image_processor")
        (tmp_path / "preprocessor_config.json").write_text(json.dumps({**image, "processor_class": processor_class}))
    (tmp_path / "processor_config.json").write_text(json.dumps(config))
    model = HookedVLM.from_pretrained(str(tmp_path), device="cpu")
    assert type(model.processor.image_processor).__name__.endswith("Pil")
    inputs = model.prepare(images=[random_image(70, 40, 1)], prompts=["How many dots are there?"])
    assert sum(len(r) for r in inputs.regions.image) > 0
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
