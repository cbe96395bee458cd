"""WIP (branch i39d-phi4, not on main): Phi-4-multimodal's vision path against HF on hand-built inputs (no
processor yet: HF's needs torchvision)."""


def test_one_image_hand_built_inputs_match_hf():
    import torch
    from transformers import Phi4MultimodalConfig, Phi4MultimodalForCausalLM
    from vlens import HookedVLM
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = Phi4MultimodalConfig(
        vocab_size=64, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, original_max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.6},
        vision_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                           patch_size=4, crop_size=16, image_token_id=5, feature_layer=-2),
        audio_config=dict(hidden_size=16, intermediate_size=16, num_blocks=1, num_attention_heads=2, ext_pw_out_channel=16,
                          depthwise_separable_out_channel=16, nemo_conv_channels=16, input_size=8, audio_token_id=6))
    cfg._attn_implementation = "eager"
    hf = Phi4MultimodalForCausalLM(cfg).eval()
    from vlens.testing.common import perturb_norms
    perturb_norms(hf, 0)
    with torch.no_grad():
        e = hf.model.embed_tokens_extend.image_embed
        e.global_img_feature_extensor.normal_(); e.sub_img_feature_extensor.normal_()
    model = HookedVLM.from_hf(hf)
    # one image: 2 x 1 crops of 16 px (HD image 32 x 16), plus the global view
    n_images, rows, cols = 1, 2, 1
    crops = 1 + rows * cols
    pv = torch.randn(n_images, crops, 3, 16, 16)
    mask = torch.ones(n_images, crops, 4, 4)
    sizes = torch.tensor([[rows * 16, cols * 16]])
    base = 2
    n_tok = (rows*base) * (cols*base + 1) + 1 + base * (base + 1)
    ids = torch.tensor([[1, 7, 8] + [5] * n_tok + [9, 10, 11]])
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), image_pixel_values=pv, image_attention_mask=mask, image_sizes=sizes)
    with torch.no_grad():
        theirs = hf(**kw).logits
        ours = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pv, image_attention_mask=mask, image_sizes=sizes)
    assert (ours - theirs).abs().max() <= 1e-4
