"""Every attack checks its inputs up front and fails in one named line.

The checks (`leakjax.checks`, `leakjax.errors.check_like`,
`leakjax.models.check_params`) run at each host entry point before any
work: the usual Flax slips with the gradient pytree, a vocabulary that does
not fit the embedding, a model without a fact the attack reads, a tokenizer
without a method it calls, an empty bag. Each test asserts the message.
"""

import dataclasses
import functools
import inspect
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import attacks, errors, fl, models
from leakjax._jit import jitted
from leakjax.attacks import dager
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2

V = 64
WRAPPED = r"did you pass \{'params': grads\}\?\); pass grads\['params'\]"


@functools.cache
def tiny(vocab=V):
  """`(model, params)`: a random 2-block GPT-2 (tied head)."""
  config = gpt2.GPT2Config.tiny(
    vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=16
  )
  return gpt2.init_model(config, key=jax.random.key(0))


@functools.cache
def tiny_grads():
  model, params = tiny()
  ids = jnp.asarray([[1, 5, 9, 13, 17], [2, 6, 10, 14, 18]], jnp.int32)
  return fl.client_gradient(model, params, ids, jnp.ones_like(ids))


class WordTokenizer:
  """Enough of a tokenizer for FILM's checks (never reached past them)."""

  bos_id = 0

  def decode(self, ids, skip_special=True):
    return ' '.join(map(str, ids))

  def token_strings(self):
    return [str(i) for i in range(V)]


def dager_config(**changes):
  default = inspect.signature(dager.recover).parameters['config'].default
  return dataclasses.replace(
    default, max_live=8, max_done=8, max_length=10, chunk=8, **changes
  )


def film_recover(model, params, grads):
  model = model.replace(tokenizer=WordTokenizer())
  return attacks.film.recover(
    model,
    params,
    grads,
    config=attacks.FilmAttackConfig(),
    key=jax.random.key(0),
  )


ENTRY_POINTS = {
  'extract_bag': attacks.extract_bag,
  'film.recover': film_recover,
  'dager.recover': lambda m, p, g: dager.recover(
    m, p, g, config=dager_config()
  ),
}


# ------------------------------------------------------- gradient pytrees
@pytest.mark.slow
@pytest.mark.parametrize('entry', ENTRY_POINTS)
def test_a_wrapped_gradient_is_named_as_the_flax_slip(entry):
  model, params = tiny()
  with pytest.raises(LeakjaxError, match=WRAPPED):
    ENTRY_POINTS[entry](model, params, {'params': tiny_grads()})


@pytest.mark.parametrize('entry', ENTRY_POINTS)
@pytest.mark.slow
def test_a_gradient_list_is_refused(entry):
  model, params = tiny()
  leaves = jax.tree.leaves(tiny_grads())
  with pytest.raises(
    LeakjaxError, match=r'^the gradient is a list where params has a dict;'
  ):
    ENTRY_POINTS[entry](model, params, leaves)


@pytest.mark.parametrize('entry', ENTRY_POINTS)
def test_a_transposed_embedding_gradient_is_named(entry):
  model, params = tiny()
  grads = dict(tiny_grads())
  grads['wte'] = {'embedding': grads['wte']['embedding'].T}
  with pytest.raises(
    LeakjaxError,
    match=r"^the gradient at 'wte/embedding' has shape \(32, 64\) where"
    r' params has \(64, 32\);',
  ):
    ENTRY_POINTS[entry](model, params, grads)


def test_check_like_names_the_first_difference():
  ref = {'a': {'w': np.ones((2, 3))}, 'b': [np.ones(2), np.ones(4)]}
  errors.check_like(jax.tree.map(np.zeros_like, ref), ref)
  with pytest.raises(LeakjaxError, match=r"^the gradient at 'a/w' is missing"):
    errors.check_like({'a': {}, 'b': ref['b']}, ref)
  with pytest.raises(LeakjaxError, match=r"at 'a/x' is not in params"):
    errors.check_like({**ref, 'a': {**ref['a'], 'x': np.ones(1)}}, ref)
  with pytest.raises(LeakjaxError, match=r"at 'b' has 1 entries where params"):
    errors.check_like({**ref, 'b': ref['b'][:1]}, ref)
  with pytest.raises(LeakjaxError, match=r"at 'b/1' has shape \(5,\) where"):
    errors.check_like({**ref, 'b': [np.ones(2), np.ones(5)]}, ref)


# ------------------------------------------------------------ vocabulary
VOCAB_MISMATCH = (
  r"^vocab_size=150 but the word embeddings 'wte/embedding' have 200 rows;"
  r' pass vocab_size=200'
)


def test_vocab_size_is_checked_against_the_embedding_rows():
  real, params = tiny(200)
  with pytest.raises(LeakjaxError, match=VOCAB_MISMATCH):  # at build
    models.from_functions(
      real.logits_fn,
      vocab_size=150,
      word_embeddings='wte/embedding',
      params=params,
    )
  model = real.replace(vocab_size=150)  # built without params: at entry
  for entry in ('extract_bag', 'dager.recover'):
    with pytest.raises(LeakjaxError, match=VOCAB_MISMATCH):
      ENTRY_POINTS[entry](model, params, params)


@pytest.mark.slow
def test_differential_score_refuses_two_vocabularies():
  model, params = tiny(200)
  other, params_other = tiny(150)
  ids = jnp.asarray([[1, 2, 3]], jnp.int32)
  message = r"^the models differ in vocabulary: M has 200 tokens, M' 150;"
  with pytest.raises(LeakjaxError, match=message):
    attacks.differential_score(model, other, params, params_other, ids)
  score = jax.jit(
    attacks.differential_score, static_argnames=('model', 'model_prime')
  )
  with pytest.raises(LeakjaxError, match=message):
    score(model, other, params, params_other, ids)
  # Declared alike, but M' has the other embedding: its rows are checked.
  with pytest.raises(LeakjaxError, match='have 150 rows'):
    score(model, model, params, params_other, ids)
  ds = score(model, model, params, params, ids).ds
  np.testing.assert_array_equal(ds, 0.0)


# -------------------------------------------------------------- the bag
def test_an_empty_bag_is_refused_by_the_beam_search():
  model, params = tiny()
  config = attacks.BeamSearchConfig(num_beams=2, length=2)
  prompts = jnp.asarray([[[0, 5]]], jnp.int32)
  message = r'^the bag of words is empty \(bag_ids of shape \(0,\)'
  with pytest.raises(LeakjaxError, match=message):
    attacks.bag_beam_search(
      model, params, prompts, jnp.zeros((0,), jnp.int32), config=config
    )
  search = jax.jit(attacks.bag_beam_search, static_argnames=('model', 'config'))
  with pytest.raises(LeakjaxError, match=message):  # a static size: jit too
    search(model, params, prompts, jnp.zeros((0,), jnp.int32), config=config)
  with pytest.raises(LeakjaxError, match='no unmasked entry'):
    attacks.bag_beam_search(
      model,
      params,
      prompts,
      jnp.asarray([3, 4], jnp.int32),
      bag_mask=jnp.zeros(2, bool),
      config=config,
    )


@pytest.mark.slow
def test_a_bag_without_the_span_facts_says_so():
  model, params = tiny()
  grads = tiny_grads()
  inputs = {1, 5, 9, 13, 2, 6, 10, 14}  # each row's last token is a target
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # a model with every fact: no warning
    full = attacks.extract_bag(model, params, grads)
  assert full.missing_facts == ()
  assert inputs <= set(full.ids.tolist()) <= inputs | {17, 18}
  bare = model.replace(
    paths=dataclasses.replace(model.paths, attention_inputs=())
  )
  with pytest.warns(
    UserWarning,
    match='runs without its exact span test: the model declares no'
    ' attention_inputs, so tokens may be missed; declare attention_inputs=',
  ):
    bag = attacks.extract_bag(bare, params, grads)
  assert bag.missing_facts == ('attention_inputs',)
  assert set(bag.ids.tolist()) < set(full.ids.tolist())  # it lost tokens
  assert bag.method == full.method == 'tied'
  no_first = model.replace(first_layer_fn=None)
  with pytest.warns(UserWarning, match='declares no first_layer_inputs'):
    bag = attacks.extract_bag(no_first, params, grads)
  assert bag.missing_facts == ('first_layer_inputs',)
  # Methods that never use the span test do not warn.
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert (
      attacks.extract_bag(bare, params, grads, method='norm').missing_facts
      == ()
    )


# ---------------------------------------------------- facts and tokenizer
def test_dager_checks_its_facts_before_any_work():
  model, params = tiny()
  grads = tiny_grads()
  # The wrappers dager.recover jits its kernels with (cached per kernel).
  layer1 = dager.pipeline._layer1  # pylint: disable=protected-access
  span2 = dager.pipeline._span2  # pylint: disable=protected-access
  sizes = (
    jitted(layer1, static_argnames=('model', 'config'))._cache_size(),
    jitted(span2, static_argnames=('model', 'config'))._cache_size(),
  )
  no_head = model.replace(head_fn=None)
  with pytest.raises(
    LeakjaxError,
    match=r'^DAGER needs lm_head: this model declares no lm_head function;'
    r' pass lm_head= to from_functions or lm_head_method= to from_flax',
  ):
    dager.recover(no_head, params, grads, config=dager_config())
  with pytest.raises(LeakjaxError, match='DAGER needs hidden_states'):
    dager.recover(
      model.replace(hidden_fn=None), params, grads, config=dager_config()
    )
  with pytest.raises(LeakjaxError, match='DAGER needs first_layer_inputs'):
    dager.recover(
      model.replace(first_layer_fn=None), params, grads, config=dager_config()
    )
  one_block = model.replace(
    paths=dataclasses.replace(
      model.paths, attention_inputs=model.paths.attention_inputs[:1]
    )
  )
  with pytest.raises(
    LeakjaxError,
    match=r'DAGER needs the attention input kernels of 2 blocks; the model'
    r' declares 1 \(attention_inputs\); pass attention_inputs=',
  ):
    dager.recover(one_block, params, grads, config=dager_config())

  class OnlyBos:
    bos_id = 0

  with pytest.raises(
    LeakjaxError,
    match=r"^DAGER uses the model's tokenizer, which \(OnlyBos\) has no"
    r" method 'decode';",
  ):
    dager.recover(
      model.replace(tokenizer=OnlyBos()), params, grads, config=dager_config()
    )
  assert sizes == (
    jitted(layer1, static_argnames=('model', 'config'))._cache_size(),
    jitted(span2, static_argnames=('model', 'config'))._cache_size(),
  )  # nothing was compiled, so nothing ran
  # Without the last-token completion, no head is needed.
  out = dager.recover(
    no_head, params, grads, config=dager_config(complete_last_token=False)
  )
  assert sorted(out.prefixes) == [[1, 5, 9, 13], [2, 6, 10, 14]]


def test_film_checks_its_tokenizer_before_any_work():
  model, params = tiny()
  tok = WordTokenizer()
  broken = types.SimpleNamespace(bos_id=0, decode=tok.decode)
  with pytest.raises(
    LeakjaxError,
    match=r"^FILM uses the model's tokenizer, which \(SimpleNamespace\) has"
    r" no method 'token_strings';",
  ):
    attacks.film.recover(
      model.replace(tokenizer=broken),
      params,
      tiny_grads(),
      config=attacks.FilmAttackConfig(),
      key=jax.random.key(0),
    )
