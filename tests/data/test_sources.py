"""data.mix / data.eval_mix entries 'name:split[:count]': quotas, seeded draws, overlap refusal."""
import ml_collections
import pytest

from rlrag_jax.data import sources


def _cfg(data_dir, mix, eval_mix, **kw):
  return ml_collections.ConfigDict(dict(
      source="files", dir=str(data_dir), mix=mix, eval_mix=eval_mix, max_train=0, max_eval=0,
      skip_invalid=False, allow_short=False, check_overlap=True, max_contexts=0,
      val_mix=()) | kw)


def test_parse_spec_and_its_errors():
  assert sources.parse_spec("hotpotqa:train:10000") == ("hotpotqa", "train", 10000)
  assert sources.parse_spec("2wiki:dev") == ("2wiki", "dev", 0)
  assert sources.parse_spec("musique") == ("musique", None, 0)
  for bad in ("hotpotqa:train:ten", "hotpotqa:train:0", "hotpotqa:train:-5", ":dev",
              "a:b:1:2"):
    with pytest.raises(ValueError, match=r"config key 'data.mix' entry"):
      sources.parse_spec(bad)


def test_quotas_draw_seeded_samples_per_dataset(shared_data_dir):
  cfg = _cfg(shared_data_dir, ("hotpotqa:train:7", "musique:train:5"), ("hotpotqa:dev:4",))
  sel = sources.select(cfg, seed=0)
  assert [ex.source for ex in sel.train].count("hotpotqa") == 7
  assert [ex.source for ex in sel.train].count("musique") == 5
  assert len(sel.eval) == 4 and {ex.source for ex in sel.eval} == {"hotpotqa"}
  again = sources.select(cfg, seed=0)
  assert [ex.id for ex in again.train] == [ex.id for ex in sel.train]
  other = sources.select(cfg, seed=1)
  assert {ex.id for ex in other.train} != {ex.id for ex in sel.train}


def test_quota_above_the_split_is_a_clear_error_unless_allow_short(shared_data_dir, caplog):
  cfg = _cfg(shared_data_dir, ("musique:train:5000",), ())
  with pytest.raises(sources.QuotaError,
                     match=r"'musique:train:5000': asks for 5000 examples but musique split "
                           r"train has 100"):
    sources.select(cfg)
  cfg.allow_short = True
  assert len(sources.select(cfg).train) == 100
  assert "data.allow_short=True: taking all 100" in caplog.text


def test_train_eval_overlap_is_refused(shared_data_dir):
  cfg = _cfg(shared_data_dir, ("hotpotqa:dev:50",), ("hotpotqa:dev",))
  with pytest.raises(sources.OverlapError, match=r"50 of 1000 evaluation questions"):
    sources.select(cfg)
  cfg.check_overlap = False
  assert len(sources.select(cfg).eval) == 1000


def test_a_missing_data_dir_names_the_config_key_and_its_path(tmp_path, monkeypatch):
  """With data.dir set, a missing folder or split file names the key and the path it was
  given, never RLRAG_DATA_DIR (which data.dir replaces)."""
  monkeypatch.setenv("RLRAG_DATA_DIR", str(tmp_path / "env"))
  missing = tmp_path / "nowhere"
  with pytest.raises(FileNotFoundError) as e:
    sources.select(_cfg(missing, ("hotpotqa:train",), ()))
  assert str(e.value) == (f"config key 'data.dir' is '{missing}', which is not a directory (it "
                          "holds the datasets of data.mix entry 'hotpotqa:train', in place of "
                          "RLRAG_DATA_DIR)")
  (tmp_path / "data" / "hotpotqa").mkdir(parents=True)
  (tmp_path / "data" / "hotpotqa" / "dev.jsonl").write_text("")
  for entry in ("hotpotqa:train", "musique:dev"):      # a missing split file; a missing folder
    name, split, _ = sources.parse_spec(entry)
    folder = tmp_path / "data" / ("hotpotqa" if name == "hotpotqa" else "musique")
    with pytest.raises(FileNotFoundError) as e:
      sources.select(_cfg(tmp_path / "data", (), (entry,)))
    msg = str(e.value)
    assert msg.startswith(f"config key 'data.dir' is '{tmp_path / 'data'}', data.eval_mix entry "
                          f"'{entry}': dataset '{name}' split '{split}': expected file "
                          f"{folder / f'{split}.jsonl'}, which does not exist"), msg
    assert "RLRAG_DATA_DIR" not in msg and str(tmp_path / "env") not in msg


def test_without_data_dir_a_missing_file_names_rlrag_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("RLRAG_DATA_DIR", str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"hotpotqa/train\.jsonl, which does not exist \("
                                              rf"data dir {tmp_path} from RLRAG_DATA_DIR="):
    sources.select(_cfg("", ("hotpotqa:train",), ()))


def test_validation_draws_from_what_train_and_eval_leave(shared_data_dir):
  """data.val_mix: seeded draws disjoint from training, evaluation and each other; a count above
  what is left is a QuotaError naming the key, or the rest with allow_short."""
  key = sources._question_key                          # pylint: disable=protected-access
  cfg = _cfg(shared_data_dir, ("musique:train:60",), ("musique:dev:5",),
             val_mix=("musique:train:30", "musique:dev:10"))
  sel = sources.select(cfg, seed=0)
  assert [ex.source for ex in sel.val] == ["musique"] * 40
  qs = [{key(ex.question) for ex in part} for part in (sel.train, sel.eval, sel.val)]
  assert not qs[0] & qs[2] and not qs[1] & qs[2] and len(qs[2]) == 40
  assert [ex.id for ex in sources.select(cfg, seed=0).val] == [ex.id for ex in sel.val]
  assert {ex.id for ex in sources.select(cfg, seed=1).val} != {ex.id for ex in sel.val}
  cfg.val_mix = ("musique:train:50",)
  with pytest.raises(sources.QuotaError, match=r"'data.val_mix' entry 'musique:train:50': asks "
                     r"for 50 examples but musique split train has 40 left after"):
    sources.select(cfg, seed=0)
  cfg.allow_short = True
  assert len(sources.select(cfg, seed=0).val) == 40
