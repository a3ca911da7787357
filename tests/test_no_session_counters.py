"""No tracked text file names an internal work counter ('session 46', 'pre-session-40'): a
reader of the repository cannot resolve one. Results name the commit they were made at, or a
commit range with its date (issue 53 item 12). Words like an HTTP session or pytest's
scope='session' are not counters and stay."""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
SELF = "tests/test_no_session_counters.py"     # its examples are counters
COUNTER = re.compile(r"\bsessions?[\s-]+\d+\b", re.IGNORECASE)


def _tracked_text_files():
  out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
  for name in out.stdout.decode().split("\0"):
    path = ROOT / name
    if not name or not path.is_file() or name == SELF:
      continue
    data = path.read_bytes()
    if b"\0" in data[:8192]:                    # binary (images, archives)
      continue
    try:
      yield name, data.decode("utf-8")
    except UnicodeDecodeError:
      continue


def test_the_pattern_catches_the_forms_the_tree_used():
  for text in ("rerun in session 46", "Sessions 37-38: what", "pre-session-40 table",
               "made here (session\n38, on an H100", "A session-31 oracle"):
    assert COUNTER.search(text), text
  for text in ('@pytest.fixture(scope="session")', "requests.Session()", "this session's run",
               "the next GPU session"):
    assert not COUNTER.search(text), text


def test_no_tracked_text_file_names_a_session_counter():
  found = []
  for name, text in _tracked_text_files():
    for m in COUNTER.finditer(text):
      line = text.count("\n", 0, m.start()) + 1
      found.append(f"{name}:{line}: {m.group(0)!r}")
  assert not found, "name the commit instead:\n" + "\n".join(found)
