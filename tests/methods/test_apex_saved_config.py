"""pipeline._run_config: a saved config.json from before a key was added reads back with the
value that reproduces the run (config_base.ADDED_LATER, apex settings.ADDED_LATER), so that the
tasks' one-time parse of their section finds every key."""
import json

from configs import apex_executor, apex_planner
from rlrag_jax.methods.apex import pipeline, settings


def _saved(tmp_path, config, drop):
  d = json.loads(config.to_json_best_effort())
  for key in drop:
    *parents, leaf = key.split(".")
    node = d
    for p in parents:
      node = node[p]
    del node[leaf]
  (tmp_path / "model").mkdir(parents=True)
  (tmp_path / "config.json").write_text(json.dumps(d))
  return str(tmp_path)


def test_an_old_executor_config_gains_the_keys_added_since(tmp_path):
  run = _saved(tmp_path, apex_executor.get_config(""),
               ["apex.max_passage_words", "model.thinking", "sft.epochs", "retrieval.url",
                "retrieval.url_timeout_s", "retrieval.url_retries",
                "retrieval.url_max_failure_rate", "retrieval.url_failure_window"])
  c = pipeline._run_config(run)
  s = settings.executor(c)
  assert s.max_passage_words == 0 and c.model.thinking is False and c.sft.epochs == 0.0
  assert c.retrieval.url == ""                     # searched in process, as before the key
  assert c.retrieval.url_failure_window == apex_executor.get_config("").retrieval.url_failure_window


def test_an_old_planner_config_gains_the_keys_added_since(tmp_path):
  run = _saved(tmp_path, apex_planner.get_config(""), ["apex.rewrite_symbolic",
                                                        "apex.gold_plans"])
  s = settings.planner(pipeline._run_config(run))
  assert s.rewrite_symbolic is True and s.gold_plans == ""
  # a config of today is read as saved
  today = apex_planner.get_config("")
  assert settings.planner(today) == s
