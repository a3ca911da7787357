"""SPARKLE's proxy-call lengths: Table 6's max length 2048 holds in RL (sparkle.max_len: a call's
prompt + output), and the ':paper' output caps are the authors' 160 tokens for every role. The
prompt-cutting rule is checked against plain list arithmetic on a stand-in task."""
import types

from configs import sparkle
from rlrag_jax.methods.sparkle.task import ProxyTask


def _stand_in(positions, max_len, max_new):
  return types.SimpleNamespace(positions=positions, max_len=max_len, max_new=max_new,
                               encode=lambda text: list(range(len(text))))


def test_a_proxy_call_fits_max_len_with_its_role_s_output():
  text = "x" * 3000                                   # 3,000 prompt "tokens"
  t = _stand_in(positions=32768, max_len=2048, max_new={"ki": 160, "rd": 160})
  ids = ProxyTask.role_prompt_ids(t, "ki", text)
  assert ids == list(range(3000))[-(2048 - 160):]     # the last tokens kept, 1,888 of them
  t = _stand_in(positions=1024, max_len=2048, max_new={"ki": 48})
  assert len(ProxyTask.role_prompt_ids(t, "ki", text)) == 1024 - 48   # the model's bound
  t = _stand_in(positions=32768, max_len=0, max_new={"ki": 48})       # 0: positions only
  assert ProxyTask.role_prompt_ids(t, "ki", text) == list(range(3000))


def test_paper_preset_lengths_and_cpu_default_unchanged():
  p = sparkle.get_config("paper")
  assert p.sparkle.max_len == 2048 and p.sft.max_len == 2048               # Table 5 / Table 6
  assert (p.sparkle.max_new.rd, p.sparkle.max_new.qf, p.sparkle.max_new.ki) == (160, 160, 160)
  d = sparkle.get_config("")
  assert d.sparkle.max_len == 0
  assert dict(d.sparkle.max_new) == dict(rd=6, qf=72, ki=24, reader=40)
