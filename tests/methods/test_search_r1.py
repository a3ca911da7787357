"""Search-R1: the seven QA sets' loaders (PopQA from a fixture), the answer parsing and EM
reward, the presets' values against the paper's, the corpus rule of the open-domain presets,
the evaluation report, and `python -m rlrag_jax.evaluate` end to end on a tiny HF checkpoint."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import apex_executor, search, search_r1, sparkle
from rlrag_jax import config_check
from rlrag_jax.data import loaders
from rlrag_jax.methods.search_r1 import prompts, report, rewards

ROOT = pathlib.Path(__file__).resolve().parents[2]
POPQA = [{"id": "popqa_0", "question": "Who wrote Hamlet?",
          "golden_answers": ["William Shakespeare", "Shakespeare"]},
         {"id": "popqa_1", "question": "What is the capital of France?",
          "golden_answers": ["Paris"]}]


def _write_jsonl(path, records):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


# ----------------------------------------------------------------------------- loaders


def test_popqa_loads_from_flashrag_layout(tmp_path, monkeypatch):
  _write_jsonl(tmp_path / "popqa" / "test.jsonl", POPQA)
  monkeypatch.setenv("RLRAG_DATA_DIR", str(tmp_path))
  got = loaders.load_dataset("popqa")
  assert [(e.id, e.question, e.answers, e.source, e.contexts) for e in got] == [
      ("popqa_0", "Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"], "popqa", []),
      ("popqa_1", "What is the capital of France?", ["Paris"], "popqa", [])]


def test_multi_hop_sets_read_flashrag_layout_too(tmp_path):
  """FlashRAG ships HotpotQA / 2Wiki / MuSiQue / Bamboogle as question + golden_answers."""
  f = _write_jsonl(tmp_path / "dev.jsonl", [
      {"id": "3hop1__1_2_3", "question": "Q?", "golden_answers": ["A", "a2"], "metadata": {}}])
  ex, = loaders.load_dataset("musique", path=f)
  assert (ex.question, ex.answers, ex.source, ex.hops) == ("Q?", ["A", "a2"], "musique", 3)
  ex, = loaders.load_dataset("hotpotqa", path=f)
  assert (ex.source, ex.hops, ex.contexts) == ("hotpotqa", 2, [])


def test_a_malformed_record_names_file_line_and_field(tmp_path):
  f = _write_jsonl(tmp_path / "test.jsonl", [POPQA[0], {"id": "x", "question": "Q",
                                                         "golden_answers": "Paris"}])
  with pytest.raises(loaders.DataError, match=r"test.jsonl:2: field 'golden_answers': expected "
                                              r"list"):
    loaders.load_dataset("popqa", path=f)
  got, rep = loaders.load_dataset("popqa", path=f, skip_invalid=True, return_report=True)
  assert len(got) == 1 and (rep.num_loaded, rep.num_skipped) == (1, 1)


def test_a_missing_dataset_names_the_file_and_the_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("RLRAG_DATA_DIR", str(tmp_path))
  with pytest.raises(FileNotFoundError) as e:
    loaders.load_dataset("popqa")
  msg = str(e.value)
  assert str(tmp_path / "popqa" / "test.jsonl") in msg and "RLRAG_DATA_DIR" in msg


# ----------------------------------------------------------------------------- parsing, reward


@pytest.mark.parametrize("text,answers,want", [
    ("<think> x </think>\n<answer> Beijing </answer>", ["beijing"], 1.0),
    ("<answer>The Beatles.</answer>", ["Beatles"], 1.0),          # articles and punctuation
    ("<answer> Paris </answer> then <answer> Lyon </answer>", ["Paris"], 0.0),   # the last one
    ("<answer> Paris", ["Paris"], 0.0),                             # unclosed: no answer
    ("no tags at all", ["x"], 0.0),
    (b"<answer> caf\xc3\xa9 </answer>", ["café"], 1.0),
    (None, ["x"], 0.0),
])
def test_reward_is_the_exact_match_of_the_last_answer(text, answers, want):
  r = rewards.reward(text, answers)
  assert r["total"] == r["em"] == want
  assert set(r) == {"total", "em", "answered"}


def test_query_of_a_turn():
  assert rewards.extract_query("<think>a</think>\n<search> who is  x </search>") == "who is x"
  assert rewards.extract_query("<search> a </search> <answer> b </answer>") is None
  assert rewards.extract_query("<search>   </search>") is None
  assert rewards.extract_query("<search> a <think> </search>") is None


def test_passages_are_formatted_as_the_authors_do():
  class Hit:
    def __init__(self, title, text):
      self.title, self.text = title, text
  assert prompts.format_docs([Hit("Evan Morris", "Evan L. Morris was"), Hit("B", "t <answer>")]) \
      == 'Doc 1(Title: "Evan Morris") Evan L. Morris was\nDoc 2(Title: "B") t'
  assert prompts.prompt("Who  was?").endswith("<answer> Beijing </answer>. Question: Who was?\n")


# ----------------------------------------------------------------------------- presets


def test_paper_presets_hold_the_papers_values():
  """Search-R1 section 4 / appendix B: PPO actor lr 1e-6, critic 1e-5, KL 0.001 low_var_kl,
  clip 0.2, GAE lambda 1 gamma 1; top-3 of wiki-18, 4 searches, 500-token responses and
  retrieved content; GRPO 5 responses a prompt; NQ + HotpotQA training, seven evaluation sets."""
  ppo, grpo = search_r1.get_config("paper"), search_r1.get_config("paper_grpo")
  for c in (ppo, grpo):
    assert (c.rl.lr, c.rl.kl_beta, c.rl.kl_estimator, c.rl.kl_form) == (1e-6, 0.001, "k3", "loss")
    assert (c.rl.clip_eps_low, c.rl.clip_eps_high) == (0.2, 0.2)
    assert (c.tool.top_k, c.tool.max_turns, c.tool.max_obs_tokens) == (3, 4, 500)
    assert c.rl.max_new_tokens == c.eval.max_new_tokens == 500
    assert tuple(c.data.mix) == ("nq:train", "hotpotqa:train")
    assert tuple(c.data.eval_mix) == ("nq:test", "triviaqa:test", "popqa:test", "hotpotqa:dev",
                                      "2wiki:dev", "musique:dev", "bamboogle:test")
    assert (c.model.init, c.data.source, c.data.prompt_style) == ("hf", "files", "paper")
  assert (ppo.rl.algo, ppo.rl.ppo.vf_lr, ppo.rl.ppo.lam, ppo.rl.ppo.gamma) == ("ppo", 1e-5, 1, 1)
  assert (grpo.rl.algo, grpo.rl.group_size) == ("grpo", 5)
  assert (search_r1.get_config("grpo").rl.algo, search_r1.get_config("grpo").rl.group_size) \
      == ("grpo", 5)
  assert set(report.PUBLISHED["qwen2.5-7b-base-ppo"]) == set(report.DATASETS)


# Each preset that evaluates open-domain questions, and the datasets that need the corpus.
OPEN_DOMAIN = [(sparkle.get_config, "paper", ("nq", "bamboogle", "triviaqa")),
               (apex_executor.get_config, "paper", ("bamboogle",)),
               (search_r1.get_config, "paper", ("nq", "hotpotqa", "popqa", "bamboogle")),
               (search_r1.get_config, "paper_grpo", ("nq", "triviaqa", "musique"))]


@pytest.mark.parametrize("make,preset,names", OPEN_DOMAIN)
def test_open_domain_presets_refuse_to_start_without_a_corpus(make, preset, names):
  c = make(preset)
  found = config_check.problems(c)
  assert len(found) == 1
  for word in names + config_check.CORPUS_KEYS:
    assert word in found[0]
  for key, value in (("corpus", "wiki18"), ("index", "/some/index"),
                     ("url", "http://127.0.0.1:8000")):
    c = make(preset)
    c.retrieval[key] = value
    assert config_check.problems(c) == []


def test_the_search_agents_open_domain_evaluation_needs_a_corpus_too():
  c = search.get_config("paper")          # 2Wiki held out, its corpus named: allowed
  assert config_check.problems(c) == []
  c.retrieval.corpus, c.data.eval_mix = "", ("2wiki:dev", "popqa:test")
  found, = config_check.problems(c)
  assert found.startswith("data.eval_mix names popqa, which needs a retrieval corpus")
  c.data.eval_mix = ("2wiki:dev",)        # 2Wiki's own paragraphs: the pooled corpus is its own
  assert config_check.problems(c) == []


@pytest.mark.parametrize("make", [search.get_config, sparkle.get_config,
                                  apex_executor.get_config, search_r1.get_config])
def test_cpu_defaults_search_their_world_and_need_no_corpus(make):
  c = make("")
  assert c.data.source == "world" and config_check.problems(c) == []


# ----------------------------------------------------------------------------- report


def test_report_lists_every_dataset_the_missing_ones_with_their_reason():
  rng = np.random.default_rng(0)
  rows, per = [], {}
  for d in ("nq", "triviaqa", "hotpotqa", "2wiki", "musique", "bamboogle"):
    em = (rng.random(20) < 0.4).astype(float)
    per[d] = em.mean()
    rows += [{"dataset": d, "em": float(v)} for v in em]
  text = report.format_report(rows, ["nq", "triviaqa", "hotpotqa", "2wiki", "musique",
                                     "bamboogle"], {"popqa": "no file at X"},
                              "qwen2.5-7b-base-ppo")
  lines = text.splitlines()
  for d in report.DATASETS:
    assert any(line.startswith(d + " ") for line in lines), d
  assert "popqa" in text and "missing: no file at X" in text
  nq = next(line for line in lines if line.startswith("nq "))
  assert f"{per['nq']:.3f}" in nq and nq.rstrip().endswith("0.480")
  avg = next(line for line in lines if line.startswith("average"))
  assert "6/7" in avg and f"{np.mean(list(per.values())):.3f}" in avg
  pub = report.PUBLISHED["qwen2.5-7b-base-ppo"]
  same = np.mean([pub[d] for d in per])          # the published mean over the same six sets
  assert avg.rstrip().endswith(f"{same:.3f} (same datasets)")
  unknown = report.format_report(rows, list(per), {}, "qwen2.5-3b-base-ppo")
  assert "unknown" in unknown


# ----------------------------------------------------------------------------- end to end


def _tiny_encoder(folder: pathlib.Path) -> pathlib.Path:
  """A random one-layer BERT with the packaged MiniLM's tokenizer: the CLI's retrieval runs
  for real, in a second instead of MiniLM's minute over 1,000 passages."""
  import shutil
  import torch
  import transformers
  from rlrag_jax.retrieval.encoder import default_model_dir
  src = default_model_dir()
  tok = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
  torch.manual_seed(0)
  cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=128)
  transformers.BertModel(cfg).save_pretrained(folder)
  tok.save_pretrained(folder)
  return folder


def test_evaluate_reports_all_seven_datasets_for_an_hf_checkpoint(tmp_path, shared_data_dir):
  """`python -m rlrag_jax.evaluate --config=configs/search_r1.py:paper` on a tiny random HF
  checkpoint, the wiki-18 sample and the shared QA samples (six sets) plus PopQA from a
  fixture: EM per dataset beside the published row, all seven listed."""
  from hf_tiny import E2E_HF, make_tiny_checkpoint
  ckpt = make_tiny_checkpoint(tmp_path, "qwen2", **E2E_HF)
  data = tmp_path / "data"
  data.mkdir()
  for d in ("nq", "triviaqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "corpus"):
    (data / d).symlink_to(shared_data_dir / d)
  _write_jsonl(data / "popqa" / "test.jsonl", POPQA)
  args = [sys.executable, "-m", "rlrag_jax.evaluate", "--config=configs/search_r1.py:paper",
          f"--checkpoint={ckpt}", "--config.retrieval.corpus=wiki18",
          "--config.retrieval.backend=exact", f"--config.retrieval.cache_dir={tmp_path / 'ix'}",
          f"--config.retrieval.encoder_path={_tiny_encoder(tmp_path / 'enc')}",
          "--config.search_r1.eval_per_dataset=2",
          "--config.search_r1.published=qwen2.5-7b-base-ppo",
          "--config.eval.max_new_tokens=6", "--config.tool.max_obs_tokens=48",
          "--config.tool.max_turns=2", "--config.tool.context_bucket=64",
          "--config.eval.batch_size=16", f"--out={tmp_path / 'out.json'}"]
  env = dict(os.environ, RLRAG_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
  out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout
  assert "published (qwen2.5-7b-base-ppo)" in text
  for d in report.DATASETS:
    line = next(x for x in text.splitlines() if x.startswith(d + " "))
    assert line.split()[1] == "2" and line.rstrip().endswith(
        f"{report.PUBLISHED['qwen2.5-7b-base-ppo'][d]:.3f}")
  assert next(x for x in text.splitlines() if x.startswith("average")).split()[1] == "7/7"
  saved = json.loads((tmp_path / "out.json").read_text())
  assert len(saved["rows"]) == 14 and saved["report"] in text



def test_a_missing_evaluation_set_is_listed_in_its_place(tmp_path, monkeypatch, shared_data_dir):
  """Without PopQA's file the task still evaluates the other six and records why PopQA is
  missing (the loader's message: the file and RLRAG_DATA_DIR); the report lists it in its
  place. A missing training file leaves no training data rather than part of the mix."""
  from rlrag_jax.methods.search_r1 import task as task_lib
  monkeypatch.setenv("RLRAG_DATA_DIR", str(shared_data_dir))
  c = search_r1.get_config("paper")
  sel, names, missing = task_lib._select(c, 2)           # pylint: disable=protected-access
  assert names == list(report.DATASETS) and list(missing) == ["popqa"]
  assert "popqa/test.jsonl" in missing["popqa"] and "RLRAG_DATA_DIR" in missing["popqa"]
  assert sel.train == []                                  # no NQ train among the samples
  assert sorted({e.source for e in sel.eval}) == sorted(set(report.DATASETS) - {"popqa"})
  assert len(sel.eval) == 12
  rows = [{"dataset": e.source, "em": 0.0} for e in sel.eval]
  lines = report.format_report(rows, names, missing).splitlines()
  order = [x.split()[0] for x in lines[2:2 + len(names)]]
  assert order == list(report.DATASETS) and "missing" in lines[2 + names.index("popqa")]


# ----------------------------------------------------------------------------- the task


class _HashEncoder:
  """Unit-norm sum of per-word random vectors (seeded by crc32 of the lower-cased word)."""
  dim = 32
  id = "hash-bow@search_r1-test"

  def encode(self, texts, batch_size=64):
    import re
    import zlib
    del batch_size
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for w in re.findall(r"\w+", str(t).lower()):
        out[i] += np.random.default_rng(zlib.crc32(w.encode())).standard_normal(self.dim)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

  encode_queries = encode_passages = property(lambda self: self.encode)


@pytest.fixture(scope="module")
def world_task(tmp_path_factory):
  from rlrag_jax.methods.search_r1 import task as task_lib
  c = search_r1.get_config("")
  c.workdir = str(tmp_path_factory.mktemp("search_r1"))
  c.data.world = dict(seed=0, num_countries=6, num_cities=20, num_people=80, num_orgs=30,
                      num_films=40, num_books=40, num_questions=80)
  c.data.max_eval = 8
  c.model.vocab_size = 600
  return task_lib.SearchR1Task(c, encoder=_HashEncoder())


def _numpy_top(task, query, k):
  """The top-k passage ids by plain numpy cosine over the task's corpus (the reference)."""
  enc = _HashEncoder()
  scores = enc.encode([r.title + " " + r.text for r in task.corpus]) @ enc.encode([query])[0]
  return [task.corpus[i].id for i in np.argsort(-scores, kind="stable")[:k]]


def test_sft_targets_search_each_gold_step_with_the_observations_masked(world_task):
  t = world_task
  ex = next(e for e in t.train if len(e.decomposition) == 2)
  ids, mask = t.sft_target_ids(ex), t.sft_loss_mask(ex)
  assert len(ids) == len(mask) and ids[-1] == t.tokenizer.eos_token_id
  text = t.tokenizer.decode(ids, skip_special_tokens=True)
  assert text.count("<search>") == 2 and text.count("<information>") == 2
  assert rewards.reward(text, ex.answers)["total"] == 1.0      # the demonstration is right
  masked = t.tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
  assert masked.count("<information>") == 2 and "<search>" not in masked
  assert "<answer>" not in masked


def test_env_answers_a_search_and_ends_an_answer(world_task):
  from rlrag_jax.methods.search_r1 import task as task_lib
  q = world_task.corpus[3].title
  out = task_lib._Env(world_task).batch(   # pylint: disable=protected-access
      [0, 1, 2], ["", "", ""], [f"<think> x </think>\n<search> {q} </search>",
                                "<think> x </think>\n<answer> y </answer>",
                                "<search>  </search>"])
  assert out[1] is None and out[2] is None
  assert out[0].info == {"query": q, "ids": _numpy_top(world_task, q, world_task.tool.top_k)}
  assert out[0].text.startswith("\n\n<information>Doc 1(Title: \"")
  assert out[0].tail == "</information>\n\n"


def test_with_retrieval_url_the_passages_come_from_the_server(world_task):
  """Search-R1's own retrieval protocol: a server of the same index gives the same hits."""
  from serve_helpers import serving
  from rlrag_jax.retrieval import Retriever, serve
  t = world_task
  index = serve.LoadedIndex(Retriever.load(t.index_dir, t.encoder),
                            {"n": len(t.corpus), "encoder": t.encoder.id, "backend": "exact"})
  queries = [r.title for r in t.corpus[:5]]
  with serving(serve.create_app(index)) as url:
    c = search_r1.get_config("")
    c.update(t.config)
    c.retrieval.url = url
    from rlrag_jax.methods.search_r1 import task as task_lib
    remote = task_lib.SearchR1Task(c, encoder=_HashEncoder())
    got, want = remote.retrieve(queries), t.retrieve(queries)
    assert remote.monitors() == [remote.retriever.monitor] and t.monitors() == []
    assert [[(h.id, h.title, h.text) for h in row] for row in got] == \
        [[(h.id, h.title, h.text) for h in row] for row in want]
    remote.retriever.close()
