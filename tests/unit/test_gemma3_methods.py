"""The methods on Gemma 3, whose image tokens attend bidirectionally and whose sliding layers read a window:
fast patching == naive patching (a patched image token changes the tokens of its block before it), the
stacked ablation sweep == plain hooks, TransformerLens decompositions add up through the post-norms,
L_focus where a query's window holds no image token."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens import SweepOptions
from vlens.data import make_pair
from vlens.data.templates import all_template_words
from vlens.patching import build_pair_batch, patch_layer_head, patch_layer_position, patch_layer_region
from vlens.testing import GEMMA3_WORDS, gemma3_tokenizer
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)
# a random tiny model tells the answers apart by less than the noise floor: the equalities still hold
pytestmark = pytest.mark.filterwarnings("ignore::vlens.patching.metrics.NoiseFloorWarning")

CONFIG = dict(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, sliding_window=5,
              layer_types=("sliding_attention", "full_attention", "sliding_attention"))


@pytest.fixture(scope="module")
def gemma():
    return tiny_vlm("gemma3", **CONFIG)


@pytest.fixture(scope="module")
def pair_batch(gemma):
    pairs = [make_pair(2, 3, seed=0, size=56), make_pair(4, 2, seed=1, size=40), make_pair(1, 2, seed=2, size=48)]
    return build_pair_batch(gemma, pairs)


def test_a_change_inside_an_image_block_reaches_back_to_the_block_start(gemma, pair_batch):
    state = gemma.start_run(pair_batch.clean)
    image = pair_batch.clean.regions.images[0][0]
    start, last = int(image[0]), int(image[-1])
    assert state.masks.first_affected(last) == start
    assert state.masks.first_affected(start - 1) == start - 1  # a text token: causal
    final = int(pair_batch.clean.regions.final[0])
    assert state.masks.first_affected(final) == final


@pytest.mark.parametrize("sweep, kwargs", [
    (patch_layer_region, {"component": "resid_pre"}),
    (patch_layer_region, {"component": "attn_out"}),
    (patch_layer_position, {}),
    (patch_layer_head, {"region": "image"}),
])
def test_fast_patching_equals_naive(gemma, pair_batch, sweep, kwargs):
    fast = sweep(gemma, pair_batch, options=SweepOptions(implementation="fast", max_batch=7), **kwargs)
    naive = sweep(gemma, pair_batch, options=SweepOptions(implementation="naive"), **kwargs)
    assert torch.allclose(fast.per_pair_logit_diff, naive.per_pair_logit_diff, atol=1e-5)
    for name in ("overwrite_rate", "flip_away_rate"):
        assert torch.equal(fast[name], naive[name])


def test_stacked_ablation_sweep_equals_plain_hooks():
    from vlens.ablation import collect_reference, head_ablation_sweep
    from vlens.ablation.tasks import build_task_batch

    model = tiny_vlm("gemma3", tokenizer=gemma3_tokenizer(list(GEMMA3_WORDS) + sorted(all_template_words())),
                     **CONFIG)
    evaluation = build_task_batch(model, "counting", 4, seed=0, image_size=48)
    reference = collect_reference(model, build_task_batch(model, "counting", 3, seed=0, image_size=48, reference=True),
                                  "region", options=SweepOptions(progress=False))
    fast = head_ablation_sweep(model, evaluation, "mean", reference,
                               options=SweepOptions(batch_size=2, heads_per_pass=3, progress=False))
    plain = head_ablation_sweep(model, evaluation, "mean", reference, resume=False,
                                options=SweepOptions(batch_size=4, progress=False))
    assert torch.allclose(fast.ablated_logprob, plain.ablated_logprob, atol=1e-5)
    assert not torch.isnan(fast.ablated_logprob).any()


def test_transformer_lens_decompositions_add_up_through_the_post_norms(gemma, pair_batch):
    inputs = pair_batch.clean
    logits, cache = gemma.run_with_cache(inputs)
    stack, labels = cache.decompose_resid(return_labels=True)
    torch.testing.assert_close(stack.sum(0), cache["blocks.2.hook_resid_post"], atol=1e-5, rtol=0)
    three, five = gemma.to_single_token("3"), gemma.to_single_token("5")
    stacks = {
        "decompose_resid": cache.decompose_resid(pos_slice=-1),
        "full (mlp layers)": cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False),
        "heads + remainder": cache.stack_head_results(pos_slice=-1, incl_remainder=True),
    }
    for name, stack in stacks.items():
        attrs = cache.logit_attrs(stack, tokens=three, incorrect_tokens=five, pos_slice=-1)
        torch.testing.assert_close(attrs.sum(0), logits[:, -1, three] - logits[:, -1, five], atol=1e-5, rtol=1e-4,
                                   msg=name)
    # the heads are their shares of what attention wrote (through ln1_post): the remainder holds no attention
    heads, labels = cache.stack_head_results(layer=1, return_labels=True)
    torch.testing.assert_close(heads.sum(0), cache["blocks.0.hook_attn_out"], atol=1e-5, rtol=1e-5)
    assert labels[:2] == ["L0H0", "L0H1"] and "blocks.0.attn.hook_result" not in cache.cache_dict
    with pytest.raises(UserInputError, match="ln2_post"):
        cache.get_full_resid_decomposition(expand_neurons=True)
    lens_logits = cache.apply_ln_to_stack(cache["blocks.2.hook_resid_post"][None], layer=-1)[0] @ gemma.W_U
    torch.testing.assert_close(lens_logits, logits, atol=1e-4, rtol=0)


def test_focus_loss_leaves_out_queries_whose_window_holds_no_image(gemma, pair_batch):
    """In a sliding layer the final query reads no image token: L_focus uses the other layers only, and its
    gradient is finite."""
    from vlens.interventions.focus import capture_patterns, focus_loss, focus_prior

    inputs = pair_batch.clean
    objects = [[([(10.0, 10.0)], (56, 56))], [([(5.0, 30.0)], (40, 40))], [([(20.0, 20.0)], (48, 48))]]
    prior = focus_prior(inputs, objects + objects, model=gemma) if inputs.batch_size == 6 else \
        focus_prior(inputs, objects[: inputs.batch_size], model=gemma)
    final = inputs.regions.final
    with capture_patterns(gemma, [0, 1], final) as patterns:
        gemma(inputs)
    assert float(patterns[0].detach().sum(-1).min()) > 0
    image = prior.image_mask[:, None, None, :]
    assert float((patterns[0].detach() * image).sum()) == 0.0  # layer 0 is local: its window ends before the images
    both = focus_loss(patterns, prior)
    only_global = focus_loss({1: patterns[1]}, prior)
    torch.testing.assert_close(both, only_global)
    leaf = patterns[1].detach().requires_grad_(True)
    focus_loss({0: patterns[0].detach().requires_grad_(True), 1: leaf}, prior).backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


def test_headlens_reads_image_attention_against_what_each_layer_sees(gemma, pair_batch):
    """A sliding layer whose window ends before the image sees no image token from the final position: its
    image share is 0 there and the heads' image-attention ratio is undefined (NaN), not 0 ("aggregation")."""
    from vlens.lens.corpus import task_samples
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.headlens import HeadLens

    inputs = pair_batch.clean
    out = HeadLens(gemma).run(inputs, k=3)
    shares = out.shares_by_layer()[:, 0]  # [batch, L]
    assert out.layer_image_share is not None
    assert bool((shares[:, [0, 2]] == 0).all()) and bool((shares[:, 1] == out.image_share[:, 0]).all())
    assert bool((shares[:, 1] > 0).all())
    assert float(out.image_attention[:, 0, 0].abs().max()) == 0.0
    scores = compute_head_scores(gemma, task_samples(2, seed=0, size=48), k=3,
                                 options=SweepOptions(batch_size=2, progress=False))
    ratio = scores.per_example["image_attention_ratio"]  # [examples, L, H]
    assert bool(ratio[:, [0, 2]].isnan().all()) and bool(ratio[:, 1].isfinite().all())
