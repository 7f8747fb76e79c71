"""Tests for leakjax.fl.defenses, through the client computations."""

import fl_fixtures as fx
import jax
import numpy as np
import optax
import pytest

from leakjax import fl
from leakjax.errors import LeakjaxError
from leakjax.fl import defenses


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ----------------------------------------------------------------- pruning
PRUNE_TREE = {
  'a': np.random.default_rng(0).normal(size=(1000,)).astype(np.float32),
  'b': {'c': np.random.default_rng(1).normal(size=(37, 27)).astype(np.float32)},
  'd': np.array([0.3, -2.0, 1.0], np.float32),
}


def _expected_keep(flat_abs, fraction):
  keep = np.ones(flat_abs.size, bool)
  keep[
    np.argsort(flat_abs, kind='stable')[
      : defenses.num_pruned(flat_abs.size, fraction)
    ]
  ] = False
  return keep


@pytest.mark.parametrize('scope', ['tensor', 'global'])
@pytest.mark.parametrize('fraction', [0.9, 0.999])
def test_pruning_keeps_exactly_the_top_fraction(scope, fraction):
  pruned = fx.jit(lambda t: fl.prune_by_magnitude(t, fraction, scope=scope))(
    PRUNE_TREE
  )
  before, after = _leaves(PRUNE_TREE), _leaves(pruned)
  if scope == 'tensor':
    for x, y in zip(before, after):
      keep = _expected_keep(np.abs(x.ravel()), fraction).reshape(x.shape)
      assert (y != 0).sum() == x.size - defenses.num_pruned(x.size, fraction)
      np.testing.assert_array_equal(y, np.where(keep, x, 0))
    # 1000 and 999 entries keep 1 each at p = 0.999; 3 entries keep none.
    if fraction == 0.999:
      assert [(y != 0).sum() for y in after] == [1, 1, 0]
  else:
    flat = np.concatenate([x.ravel() for x in before])
    keep = _expected_keep(np.abs(flat), fraction)
    np.testing.assert_array_equal(
      np.concatenate([y.ravel() for y in after]), np.where(keep, flat, 0)
    )
    assert (flat[keep] != 0).sum() == flat.size - defenses.num_pruned(
      flat.size, fraction
    )


def test_pruning_count_is_exact_with_ties():
  x = {'w': np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0], np.float32)}
  out = np.asarray(fx.jit(lambda t: fl.prune_by_magnitude(t, 0.5))(x)['w'])
  # 4 zeroed: the three zeros and the first tied 1.
  np.testing.assert_array_equal(out, [0, 0, 0, 0, 1, 1, 1, 2])
  assert defenses.num_pruned(100, 0.99) == 99
  assert defenses.num_pruned(3, 0.5) == 2


@pytest.mark.slow
@pytest.mark.parametrize('scope', ['tensor', 'global'])
def test_pruning_with_many_ties_matches_a_stable_sort(scope):
  # Magnitudes on a coarse grid (many exact ties, zeros, signs): the
  # selection must zero exactly the entries a stable argsort would.
  rng = np.random.default_rng(3)
  tree = {
    'u': np.round(rng.normal(size=(64, 33)), 1).astype(np.float32),
    'v': np.round(rng.normal(size=(501,)), 0).astype(np.float32),
  }
  for fraction in (0.3, 0.75, 0.97):
    out = fx.jit(
      lambda t, f=fraction: fl.prune_by_magnitude(t, f, scope=scope)
    )(tree)
    if scope == 'tensor':
      for name in tree:
        x = tree[name]
        keep = _expected_keep(np.abs(x.ravel()), fraction).reshape(x.shape)
        np.testing.assert_array_equal(out[name], np.where(keep, x, 0))
    else:
      flat = np.concatenate([tree['u'].ravel(), tree['v'].ravel()])
      keep = _expected_keep(np.abs(flat), fraction)
      got = np.concatenate([np.ravel(out['u']), np.ravel(out['v'])])
      np.testing.assert_array_equal(got, np.where(keep, flat, 0))


# ----------------------------------------------------------------- DP-SGD
def test_clip_per_example_bounds_norms_and_keeps_directions():
  rng = np.random.default_rng(0)
  scales = np.array([0.01, 0.5, 1.0, 3.0, 100.0], np.float32)
  grads = {
    'w': rng.normal(size=(5, 4, 3)).astype(np.float32),
    'b': rng.normal(size=(5, 7)).astype(np.float32),
  }
  norms0 = np.sqrt((grads['w'] ** 2).sum((1, 2)) + (grads['b'] ** 2).sum(1))
  grads = {
    k: v * (scales / norms0).reshape((5,) + (1,) * (v.ndim - 1))
    for k, v in grads.items()
  }
  clip = 1.0
  clipped, norms = fx.jit(defenses.clip_per_example, static_argnums=1)(
    grads, clip
  )
  np.testing.assert_allclose(norms, scales, rtol=1e-5)
  after = np.asarray(defenses.global_norms(clipped))
  assert np.all(after <= clip * (1 + 1e-6))
  np.testing.assert_allclose(after, np.minimum(scales, clip), rtol=1e-5)
  for k in grads:  # same direction: clipped = grads * min(1, C / norm)
    factor = np.minimum(1.0, clip / scales).reshape(
      (5,) + (1,) * (grads[k].ndim - 1)
    )
    np.testing.assert_allclose(clipped[k], grads[k] * factor, rtol=1e-5)


@pytest.mark.slow
def test_dp_sgd_gradient_is_mean_of_clipped_per_example_gradients():
  """sigma = 0: the DP-SGD gradient is (1/B) sum_i clip_C(grad loss_i)."""
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=5)
  per_example = [
    fx.loss_and_grad(model, params, ids[i : i + 1], mask[i : i + 1])[1]
    for i in range(5)
  ]
  norms = np.array(
    [np.sqrt(sum((g**2).sum() for g in _leaves(t))) for t in per_example]
  )
  clip = float(np.median(norms))  # some examples are clipped, some not
  assert (norms > clip * 1.01).any() and (norms < clip * 0.99).any()
  expected = fx.tree_map_np(
    lambda *gs: sum(g * min(1.0, clip / n) for g, n in zip(gs, norms)) / 5,
    *per_example,
  )
  grad = fx.GRADIENT(
    model,
    params,
    ids,
    mask,
    defense=fl.dp_sgd(clip, 0.0),
    key=jax.random.key(0),
  )
  fx.assert_trees_close(grad, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_dp_sgd_noise_std_is_sigma_times_clip():
  """Two keys: B * (g1 − g2) / sqrt(2) is N(0, σ²C²) noise, ~15k draws."""
  model, params = fx.model('gpt2')
  ids, mask = fx.sentences(model, n=4)
  d = fx.GPT2_DP
  g1, g2 = (
    fx.GRADIENT(model, params, ids, mask, defense=d, key=jax.random.key(s))
    for s in (1, 2)
  )
  noise = np.concatenate(
    [
      ((a - b) * 4 / np.sqrt(2)).ravel()
      for a, b in zip(_leaves(g1), _leaves(g2))
    ]
  )
  assert noise.size > 15_000
  expected = d.noise_multiplier * d.clip_norm
  assert abs(noise.std() / expected - 1) < 0.03
  assert abs(noise.mean()) < 5 * expected / np.sqrt(noise.size)


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', ['dpsgd_like', 'single_noise'])
def test_gboard_local_noise_std(algorithm):
  """GBoard Alg. 3: θ1 = θ0 − η(∇ℓ + N(0, σ)); Alg. 4: θ1 + N(0, σ)."""
  model, params = fx.model('gpt2')
  ids, mask = fx.sentences(model, n=4)
  lr, sigma = 0.1, 0.01
  if algorithm == 'dpsgd_like':
    defense, scale = fl.dpsgd_like_noise(sigma), lr * sigma
  else:
    defense, scale = fl.single_noise(sigma), sigma
  config = fl.ClientConfig.fedsgd(lr, defense)
  u1, u2 = (
    fx.UPDATE(model, params, ids, mask, config, key=jax.random.key(s)).update
    for s in (1, 2)
  )
  noise = np.concatenate(
    [((a - b) / np.sqrt(2)).ravel() for a, b in zip(_leaves(u1), _leaves(u2))]
  )
  assert abs(noise.std() / scale - 1) < 0.03
  assert abs(noise.mean()) < 5 * scale / np.sqrt(noise.size)


# ------------------------------------------------------- frozen embeddings
@pytest.mark.slow
def test_frozen_tied_gpt2_gradient_has_no_embedding_rows():
  model, params = fx.model('gpt2')
  assert model.paths.lm_head is None  # tied: wte is also the LM head
  ids, mask = fx.sentences(model, n=5)
  plain = fx.np_tree(fx.GRADIENT(model, params, ids, mask))
  frozen = fx.np_tree(
    fx.GRADIENT(model, params, ids, mask, defense=fl.freeze_embeddings(model))
  )
  assert np.abs(plain['wte']['embedding']).max() > 1e-3  # it would leak
  np.testing.assert_array_equal(frozen['wte']['embedding'], 0)
  # Every other gradient is untouched (wpe is not frozen by default).
  del plain['wte'], frozen['wte']
  fx.assert_trees_close(frozen, plain, atol=1e-7)
  assert np.abs(frozen['wpe']['embedding']).max() > 1e-4


@pytest.mark.slow
def test_frozen_composes_with_fedavg_dp_noise_and_pruning():
  """FedAvg (E=2, B=3, AdamW with weight decay) with frozen wte/wpe, DP-SGD,
  single noise and 90% pruning: the frozen matrices do not move and are not
  sent; every sent tensor keeps exactly its top 10%."""
  model, params = fx.model('gpt2')
  ids, mask = fx.sentences(model, n=7)
  defense = (
    fl.freeze_embeddings(model, positions=True)
    | fx.GPT2_DP
    | fl.single_noise(1e-3)
    | fl.gradient_pruning(0.9)
  )
  config = fl.ClientConfig(
    epochs=2,
    batch_size=3,
    learning_rate=0.01,
    defense=defense,
    optimizer=lambda lr: optax.adamw(lr, weight_decay=0.1),
  )
  result = fx.UPDATE(model, params, ids, mask, config, key=jax.random.key(0))
  update, after = fx.np_tree(result.update), fx.np_tree(result.params)
  for name in ('wte', 'wpe'):
    np.testing.assert_array_equal(update[name]['embedding'], 0)
    np.testing.assert_array_equal(
      after[name]['embedding'], params[name]['embedding']
    )
    del update[name]
  for x in jax.tree.leaves(update):
    assert (x != 0).sum() == x.size - defenses.num_pruned(x.size, 0.9)
  assert np.isfinite(result.losses).all()


@pytest.mark.slow
def test_frozen_cifg_tied_and_untied_heads():
  tied, tied_params = fx.model('cifg')
  untied, untied_params = fx.model('cifg_untied')
  ids, mask = fx.sentences(tied, n=4)
  # Tied (GBoard's shape): the shared matrix is frozen for both uses.
  grad = fx.np_tree(
    fx.GRADIENT(
      tied, tied_params, ids, mask, defense=fl.freeze_embeddings(tied)
    )
  )
  np.testing.assert_array_equal(grad['embed']['embedding'], 0)
  assert np.abs(grad['head']['bias']).max() > 1e-3  # the bias still leaks
  # Untied with head=True: embeddings, head kernel and output bias frozen.
  grad = fx.np_tree(
    fx.GRADIENT(
      untied,
      untied_params,
      ids,
      mask,
      defense=fl.freeze_embeddings(untied, head=True),
    )
  )
  for path in (
    untied.paths.word_embeddings,
    untied.paths.lm_head,
    untied.paths.output_bias,
  ):
    np.testing.assert_array_equal(fl_get(grad, path), 0)
  others = [x for k, x in grad.items() if k not in ('embed', 'head')]
  assert max(np.abs(x).max() for x in jax.tree.leaves(others)) > 1e-3


def fl_get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


# ------------------------------------------------------------ composition
def test_combine_merges_and_rejects_conflicts():
  model, params = fx.model('gpt2')
  d = (
    fl.freeze_embeddings(model)
    | fl.dp_sgd(1.0, 1.1)
    | fl.gradient_pruning(0.99, scope='global')
  )
  assert d.frozen == (('wte', 'embedding'),)
  assert (d.clip_norm, d.noise_multiplier) == (1.0, 1.1)
  assert (d.prune_fraction, d.prune_scope) == (0.99, 'global')
  assert d.needs_key and not fl.gradient_pruning(0.9).needs_key
  assert fl.combine(d, d) == d
  with pytest.raises(LeakjaxError, match='set clip_norm'):
    fl.dp_sgd(1.0, 1.1) | fl.dp_sgd(2.0, 1.1)
  with pytest.raises(LeakjaxError, match='prune_fraction'):
    fl.gradient_pruning(1.0)
  with pytest.raises(LeakjaxError, match='clip_norm'):
    fl.Defense(noise_multiplier=1.0)
  with pytest.raises(LeakjaxError, match='prune_scope'):
    fl.gradient_pruning(0.5, scope='layer')
  hash(fl.ClientConfig(defense=d))  # usable as a static jit argument
