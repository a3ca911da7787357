"""When is a search query concise? A small, documented rule set (data + one function per rule).

The search reward gives a single search 0 when its query is concise and -1 when it is not. A
concise query reads like keywords typed into a search box, not like a sentence or a question:

  non_empty       the query has at least one word.
  question_mark   no '?' anywhere.
  question_word   none of QUESTION_WORDS (who, what, when, where, which, why, how, whom, whose).
  filler_word     none of FILLER_WORDS: vague prepositions ('about', 'regarding', ...) and
                  modifiers or request words that carry no content ('please', 'exactly', ...).
  sentence_verb   none of SENTENCE_VERBS: copulas/auxiliaries ('is', 'was', 'does', ...) and
                  request verbs ('tell', 'find', 'know', ...) plus first/second-person pronouns,
                  the words that make a query read as a sentence.
  max_words       at most MAX_WORDS (6) words, counted on whitespace.

Words are matched case-insensitively on the alphanumeric pieces of the query, so "Who's" is
checked as "who" + "s" and "how-to" as "how" + "to". Articles are deliberately allowed: titles and
names contain them ("The Godfather director"). Words that are common in names are left out of the
lists (see SENTENCE_VERBS). Known limitation: a name made of listed words ("The Who",
"Do the Right Thing") still breaks a rule.

`to_keywords` turns a (sub-)question into a query that passes every rule; the gold trajectories
use it so that gold queries are concise by construction.
"""
from __future__ import annotations

import re
from typing import Callable, NamedTuple

MAX_WORDS = 6

QUESTION_WORDS = frozenset({
    "who", "what", "when", "where", "which", "why", "how", "whom", "whose"})

FILLER_WORDS = frozenset({
    # vague prepositions
    "about", "regarding", "concerning", "around",
    # modifiers / hedges / politeness that carry no content
    "please", "exactly", "actually", "really", "very", "just", "basically", "specifically",
    "particular", "certain", "some", "any", "information", "info", "details"})

SENTENCE_VERBS = frozenset({
    # copulas and auxiliaries
    "is", "are", "was", "were", "am", "be", "been", "being", "do", "does", "did",
    "has", "have", "had", "can", "could", "would", "should", "shall", "might", "must",
    # request verbs
    "tell", "find", "know", "want", "need", "search", "look", "looking", "give", "explain",
    "describe",
    # first/second-person pronouns (they only occur in sentences addressed to someone)
    "i", "me", "my", "you", "your", "we", "our"})
# Left out on purpose because they are common in names and keywords: 'will' (Will Smith),
# 'may' (May 1968), 'us' (US president), 'show' (TV show), 'more' (Thomas More).

# Dropped first by `to_keywords` when a query is still too long after the rules are applied.
DROPPABLE_WORDS = frozenset({
    "a", "an", "the", "of", "in", "on", "for", "to", "by", "with", "from", "at", "and", "or",
    "name", "named", "called"})

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def words(query: str) -> list:
  """Lowercased alphanumeric pieces of `query` (what the word-list rules look at)."""
  return _WORD.findall(str(query).lower())


def _non_empty(query: str, max_words: int) -> bool:
  del max_words
  return bool(query.split())


def _no_question_mark(query: str, max_words: int) -> bool:
  del max_words
  return "?" not in query


def _none_of(word_set: frozenset) -> Callable[[str, int], bool]:
  def rule(query: str, max_words: int) -> bool:
    del max_words
    return not any(w in word_set for w in words(query))
  return rule


def _max_words(query: str, max_words: int) -> bool:
  return len(query.split()) <= max_words


class Rule(NamedTuple):
  name: str
  check: Callable[[str, int], bool]   # (query, max_words) -> True when the query passes
  description: str


RULES = (
    Rule("non_empty", _non_empty, "at least one word"),
    Rule("question_mark", _no_question_mark, "no '?'"),
    Rule("question_word", _none_of(QUESTION_WORDS), "no question words"),
    Rule("filler_word", _none_of(FILLER_WORDS), "no filler prepositions or modifiers"),
    Rule("sentence_verb", _none_of(SENTENCE_VERBS), "no sentence-like verbs or pronouns"),
    Rule("max_words", _max_words, "at most max_words words (MAX_WORDS by default)"),
)
RULE_NAMES = tuple(r.name for r in RULES)


def violations(query, max_words: int = MAX_WORDS) -> list:
  """Names of the rules `query` breaks, in RULES order ([] when concise). Never raises."""
  query = "" if query is None else str(query)
  return [r.name for r in RULES if not r.check(query, max_words)]


def is_concise(query, max_words: int = MAX_WORDS) -> bool:
  """True when `query` passes every rule in RULES."""
  return not violations(query, max_words)


def _banned(token: str) -> bool:
  return any(w in QUESTION_WORDS or w in FILLER_WORDS or w in SENTENCE_VERBS
             for w in words(token))


def to_keywords(text: str, max_words: int = MAX_WORDS) -> str:
  """A concise keyword query made from a sentence or question ('' when nothing is left).

  Drops '?' and every whitespace word that holds a listed word, turns MuSiQue's '>>' into a
  space, then, while the query is too long, drops DROPPABLE_WORDS, and finally keeps the first
  `max_words` words. The result passes `is_concise` or is ''.
  """
  text = str(text).replace(">>", " ").replace("?", " ")
  kept = []
  for tok in text.split():
    tok = tok.strip("\"'“”‘’,;:.!()[]{}")
    if tok and words(tok) and not _banned(tok):
      kept.append(tok)
  if len(kept) > max_words:
    kept = [t for t in kept if t.lower() not in DROPPABLE_WORDS] or kept
  query = " ".join(kept[:max_words])
  return query if is_concise(query, max_words) else ""
