"""SPARKLE's inference loop and binary tree rollout with scripted models: the world oracle plays
the reader and the proxy (reading only what the prompts show), a stub retriever finds a step's
gold documents for its question. Checks the loop end to end (answers, contexts, counters),
pruning, the samples of each decision and the Monte-Carlo returns on the built tree."""
import re

import pytest

from rlrag_jax.data import world
from rlrag_jax.methods.sparkle import agent as agent_lib
from rlrag_jax.methods.sparkle import parsing, prompts
from rlrag_jax.methods.sparkle.triples import TripleStore
from test_sparkle_oracle import HashEncoder

FORCED = {parsing.YES: (1, 2), parsing.NO: (3, 4)}


class Scripted:
  """The oracle behind the proxy's and the reader's prompts, plus counters."""

  def __init__(self, w, examples, search_hits=None):
    self.w = w
    self.by_id = {r.id: r for r in w.corpus}
    self.by_title = {r.title: r.id for r in w.corpus}
    self.plans = {ex.question: prompts.Plan.of(ex.decomposition, ex.triples, ex.answers[0])
                  for ex in examples}
    self.step_docs = {p.query(i): p.gold[i] for p in self.plans.values()
                      for i in range(len(p.questions)) if p.gold[i]}
    self.others = [r.id for r in w.corpus[:50]]
    self.search_hits = search_hits
    self.read_calls = 0
    self.proposed = {"rd": 0, "qf": 0, "ki": 0}

  @staticmethod
  def field(prompt, name):
    m = re.search(rf"^{name}: (.*)$", prompt, re.M)
    return m.group(1) if m else ""

  def thoughts(self, prompt, role):
    if role == "rd" or "Current Reasoning Step" in prompt:
      prev = re.search(r"Previous Reasoning: (.*?)\nCurrent Reasoning Step: (.*?)\n", prompt,
                       re.S)
      lines = [] if prev.group(1) == "(none)" else [l[2:] for l in prev.group(1).split("\n")]
      return lines + [prev.group(2)]
    body = re.search(r"Thoughts: (.*?)\n(?:Direct query|Query):", prompt, re.S).group(1)
    return [] if body == "(none)" else [l[2:] for l in body.split("\n")]

  def propose(self, role, texts, greedy):
    self.proposed[role] += len(texts)
    out = []
    for p in texts:
      plan = self.plans[self.field(p, "Question")]
      if role == "rd":
        text = parsing.render_decision(plan.decision(self.thoughts(p, "rd")))
      elif role == "qf":
        text = plan.formulation(self.thoughts(p, "qf"),
                                direct=p.rstrip().endswith("Direct query:")) or ""
      elif "Candidate Documents:" in p:
        # Direct KI: the needed step is the first whose link the chain has not filled.
        titles = re.findall(r"^\[\d+\] (.*?): ", p, re.M)
        chain = parsing.parse_triples(self.field(p, "Reasoning Chain"))
        step = sum(t[2] != parsing.UNKNOWN for t in chain)
        gold_steps = [g for g in plan.gold if g]
        text = "[1]"
        for k, t in enumerate(titles):
          if step < len(gold_steps) and self.by_title.get(t) in gold_steps[step]:
            text = f"[{k + 1}]"
            break
      else:
        cands = [parsing.parse_triples(l)[0] for l in p.split("\n")
                 if re.match(r"^\[\d+\] <", l)]
        path = [t for t in plan.triples if t is not None]
        pick = next((k for k, c in enumerate(cands) if c in path), 0)
        text = parsing.triple_text(cands[pick])
      out.append((text, tuple(range(len(text) % 7 + 1)), False))
    return out

  def read(self, requests):
    self.read_calls += 1
    out = []
    for question, docs, thoughts in requests:
      ctx = [self.by_title[t] for t, _ in docs]
      t = self.plans[question].thought(ctx, thoughts)
      out.append(prompts.render_answer(t.text) if t.kind == "answer" else
                 prompts.render_think(t.text))
    return out

  def search(self, queries, k):
    if self.search_hits is not None:
      return [list(self.search_hits)[:k] for _ in queries]
    return [(list(self.step_docs.get(q, ())) + self.others)[:k] for q in queries]

  def docs(self, ids):
    return [(self.by_id[i].title, self.by_id[i].text) for i in ids]


@pytest.fixture(scope="module")
def w():
  return world.build(seed=0)


@pytest.fixture(scope="module")
def store(w):
  return TripleStore.from_records(w.corpus, HashEncoder())


def make(w, store, examples, cfg=None, **kw):
  s = Scripted(w, examples, **kw)
  enc = HashEncoder()
  a = agent_lib.Agent(cfg or agent_lib.AgentConfig(max_steps=12, top_triples=60), propose=s.propose,
                      read=s.read, search=s.search, embed=enc.encode, store=store,
                      docs=s.docs, encode_forced=lambda text: FORCED[text])
  return a, s


def test_oracle_models_answer_every_question_with_the_gold_context(w, store):
  examples = w.split("train")[:12]
  a, s = make(w, store, examples)
  states = a.run([ex.question for ex in examples])
  for ex, st in zip(examples, states):
    hops = sum(bool(g) for g in s.plans[ex.question].gold)
    assert st.prediction == ex.answers[0] and st.done and not st.malformed
    assert set(st.context) == set(ex.gold_ids) and st.retrievals == hops
    assert st.steps == 2 * hops + 1 and len(st.queries) == hops
    assert all(set(s.plans[ex.question].gold[i]) <= set(r) for i, r in enumerate(st.retrieved)
               if s.plans[ex.question].gold[i])
  # One batched reader call per reasoning step, whatever the batch size.
  assert s.read_calls == max(st.steps for st in states)


def test_a_reader_that_never_answers_stops_at_the_step_limit(w, store):
  examples = w.split("train")[:3]
  a, s = make(w, store, examples, agent_lib.AgentConfig(max_steps=4))
  s.read = lambda reqs: ["<think>hmm</think>"] * len(reqs)
  a.read_fn = s.read
  states = a.run([ex.question for ex in examples])
  assert all(st.done and st.answer is None and st.steps == 4 for st in states)
  assert all(st.prediction == "" for st in states)


def test_the_retrieval_cap_stops_decisions(w, store):
  examples = w.split("train")[:2]
  a, s = make(w, store, examples, agent_lib.AgentConfig(max_steps=12, max_retrievals=1))
  states = a.run([ex.question for ex in examples])
  assert all(st.retrievals == 1 and st.answer is None for st in states)


def recall_reward(examples):
  gold = {ex.question: set(ex.gold_ids) for ex in examples}
  return lambda states: [len(set(st.context) & gold[st.question]) / len(gold[st.question])
                         for st in states]


def test_tree_rollout_branches_both_ways_and_returns_are_leaf_means(w, store):
  examples = w.split("train")[1:4]
  a, s = make(w, store, examples)
  recall = recall_reward(examples)
  # Recall, less a little per reasoning step: a declined retrieval after a need costs a step.
  forest = a.tree([ex.question for ex in examples], depth=2,
                  reward=lambda sts: [r - 0.01 * st.steps for r, st in zip(recall(sts), sts)])
  nodes = forest.nodes
  for root in forest.roots:             # both decisions at the root; one level further
    kids = nodes[root].children
    assert sorted(nodes[k].action for k in kids) == [False, True]
    for k in kids:
      assert len([c for c in nodes[k].children]) in (1, 2)

  def leaves_under(n):
    if not n.children:
      return [n.reward]
    return [r for c in n.children for r in leaves_under(nodes[c])]
  for d in forest.decisions():
    want = leaves_under(nodes[d.node])
    assert d.ret == pytest.approx(sum(want) / len(want))
    roles = [smp.role for smp in d.sample]
    if d.action is True:
      assert roles[:2] == ["rd", "qf"] and d.sample[0].forced
      assert d.sample[0].completion == FORCED[parsing.YES]
    elif d.action is False:
      assert roles == ["rd"] and d.sample[0].completion == FORCED[parsing.NO]
    else:                               # past the depth: the proxy's own decisions
      assert not d.sample or (d.sample[0].role == "rd" and not d.sample[0].forced)
  # The first decision follows a need: retrieving finds the gold document, declining does not
  # (and costs a step).
  for root in forest.roots:
    by_action = {nodes[k].action: nodes[k] for k in nodes[root].children}
    assert by_action[True].state.context and not by_action[False].state.context
    assert by_action[True].ret > by_action[False].ret


def test_a_retrieval_that_adds_nothing_is_pruned_without_a_reader_call(w, store):
  examples = w.split("train")[:2]
  # Every query retrieves the same documents and KI falls back to the best candidate, so a
  # second "Yes" selects the document the first one added.
  a, s = make(w, store, examples, search_hits=[w.corpus[7].id])
  s.propose = lambda role, texts, greedy: [("garbage", (9,), False)] * len(texts)
  a.propose = s.propose
  calls = []
  read = s.read
  a.read_fn = lambda reqs: calls.append(len(reqs)) or read(reqs)
  forest = a.tree([ex.question for ex in examples], depth=2, reward=lambda st: [0.0] * len(st))
  pruned = [n for n in forest.nodes if n.pruned]
  # Per question only "Yes" below "Yes" re-selects the document already in context (below
  # "No" the context is empty, so that "Yes" adds it); linear steps past the depth never prune.
  assert len(pruned) == 2
  for n in pruned:
    parent = forest.nodes[n.parent]
    assert n.action is True and n.state.redundant
    assert forest.nodes[parent.id].state.context == (w.corpus[7].id,)
  # Level 2 reads 3 children per question (Yes-Yes pruned before the reader): 2 * 3 rows.
  assert calls[2] == 2 * 3
  # Malformed decisions, queries and selections never raise and are recorded.
  assert any("qf" in n.state.malformed for n in forest.nodes if n.parent is not None)


def test_standard_rollout_is_one_sampled_path_per_question(w, store):
  examples = w.split("train")[:3]
  a, s = make(w, store, examples)
  forest = a.tree([ex.question for ex in examples], depth=4, reward=recall_reward(examples),
                  explore=False)
  assert len(forest.leaves()) == 3
  assert all(d.action is None for d in forest.decisions())
  assert [l.reward for l in forest.leaves()] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("mode", [dict(rd_mode="reader"), dict(qf_mode="direct"),
                                  dict(qf_mode="rd"), dict(ki_mode="document"),
                                  dict(ki_mode="all", all_docs=3)])
def test_agent_ablations_run_with_the_oracle_and_make_their_own_samples(w, store, mode):
  examples = [ex for ex in w.split("train")[:12] if ex.hops == 2][:4]
  a, s = make(w, store, examples, agent_lib.AgentConfig(max_steps=12, top_triples=60, **mode))
  made = []
  states = a.run([ex.question for ex in examples], samples=made)
  for ex, st, smp in zip(examples, states, made):
    roles = [x.role for x in smp]
    assert st.prediction == ex.answers[0] and set(ex.gold_ids) <= set(st.context)
    assert ("rd" in roles) == (mode.get("rd_mode", "agent") == "agent")
    assert ("ki" in roles) == (mode.get("ki_mode") != "all")
    if mode.get("ki_mode") == "all":   # every retrieved document joined the context
      assert len(st.context) > len(set(ex.gold_ids))
    if mode.get("qf_mode") == "rd":    # the query comes from the RD prompt, after its "Yes"
      assert all(x.prompt.endswith(parsing.YES + "\n") for x in smp if x.role == "qf")
    if mode.get("qf_mode") == "direct":
      assert all(parsing.CHAIN not in x.text for x in smp if x.role == "qf")
  if mode.get("rd_mode") == "reader":  # no decision to force: the tree is one path
    forest = a.tree([ex.question for ex in examples], depth=2, reward=recall_reward(examples))
    assert len(forest.leaves()) == len(examples)


def test_unknown_ablation_values_are_rejected():
  with pytest.raises(ValueError, match="sparkle.agent.ki_mode"):
    agent_lib.AgentConfig(ki_mode="sometimes")
