"""The embedded multi-hop world: a seeded fictional encyclopaedia with 2-4 hop questions.

`build(seed=0)` is the project's default data when nothing else is configured. It invents
countries, cities, people, organisations, films and novels (names from syllables, titles from
English words), writes one short Wikipedia-style passage per entity, and asks questions whose
every fact sits in exactly one passage: the passage of the fact's head entity. A question's gold
passages are the passages of the heads it walks through, so none is answerable without them.

Relations (head -> tail; tails in quotes are literals, the rest are entity names):
  person   birth_year "1931", occupation "novelist", born_in city, spouse person (stated in one
           of the two spouses' passages only), educated_at university, member_of band
  city     located_in country, known_for "salt mines"
  country  official_name "Republic of X", continent "Y", capital city, language "Zic",
           currency "drel"
  org      kind "film studio", headquartered_in city, founded_year "1902", founded_by person
  film     genre, release_year, directed_by person, produced_by studio, based_on book
  book     genre, publication_year, written_by person, published_by publisher
Citizenship is not stated anywhere; "the country where X was born" is born_in then located_in.

Question kinds (Example.kind):
  bridge       2-hop chains: "Where was the director of The Glass Harbour born?"
  composition  3- and 4-hop chains (MuSiQue-style): "In which country was the author of the
               novel that The Glass Harbour is based on born?"
  comparison   2-4 hops: "Who was born first, A or B?", "Are X and Y in the same country?"
               (yes/no, balanced), "Whose director was born first, F1 or F2?"
Example.hops counts retrieval hops (= gold passages). Each decomposition step that reads a
passage has that passage as its single gold id; a comparison ends with one extra step that
compares earlier answers and has no gold id. `Example.meta['program']` holds the same steps
as data: {'op': 'hop', 'head': name | '#k', 'relation': r}, {'op': 'earlier', 'args': ['#i',
'#j'], 'options': [a, b]} (the option whose year is smaller) or {'op': 'same', 'args': [...]}
('yes'/'no'), so a test can replay them over `World.triples`.

Answers: canonical first, then aliases: a person's surname, a country's official name, a title
without its leading "The"; years are "1987"; comparisons answer yes/no or one of the options.
An alias that the question itself contains is dropped. An Example's contexts are its gold
passages plus `distractors_per_question` others (about `hard_distractor_frac` of them share an
entity with a gold passage), in a seeded shuffled order; context ids are passage ids.

Randomness comes from separate streams per stage (names, facts, text, questions, contexts,
splits), each seeded from `seed` and the stage name, so e.g. `num_questions` does not change
the corpus. Same seed and config give byte-identical output in any process.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import random
from typing import Callable, Optional, Union

from rlrag_jax.data import world_text as T
from rlrag_jax.data.schema import Context, CorpusRecord, Example, Step, Triple

ENTITY_TYPES = ("country", "city", "person", "org", "film", "book")
SPLITS = ("train", "dev", "test")
KINDS = ("bridge", "composition", "comparison")
# Relations whose tail is another entity (the rest are literals).
ENTITY_RELATIONS = ("born_in", "spouse", "educated_at", "member_of", "located_in", "capital",
                    "headquartered_in", "founded_by", "directed_by", "produced_by", "based_on",
                    "written_by", "published_by")
YEAR_RELATIONS = ("birth_year", "founded_year", "release_year", "publication_year")
_ENTITY_RELATIONS = frozenset(ENTITY_RELATIONS)
_LAST_YEAR = 2020
# Chain questions: weights of the start entity's type, and of the last relation asked (a
# chain is kept with that probability). Walks end on a country fact unless steered: there are
# few countries, so those answers would be easy to guess.
_START_WEIGHTS = {"film": 0.3, "book": 0.2, "person": 0.25, "org": 0.15, "city": 0.07,
                  "country": 0.03}
_LAST_WEIGHTS = {"located_in": 0.4, "capital": 0.4, "language": 0.3, "currency": 0.3}


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """Sizes and mixes of the world; `build(**sizes)` overrides any field.

  Attributes:
    num_countries: countries (each gets a capital among the cities).
    num_cities: cities (>= num_countries).
    num_people: people; some direct films, write novels, play in bands, found organisations.
    num_orgs: organisations, split over studios, publishers, universities, bands, companies and
      newspapers in the ratio 4:4:4:6:4:2.
    num_films: films (directed_by a director; some produced by a studio or based on a novel).
    num_books: novels (written_by a novelist; most with a publisher).
    num_questions: questions in all three splits together.
    dev_frac: share of the questions in dev.
    test_frac: share in test; train takes the rest.
    distractors_per_question: non-gold passages in each Example's contexts.
    hard_distractor_frac: share of those that share an entity with a gold passage (another
      film by the same director, a person born in the same city, ...); the rest are random
      passages of the gold passages' types.
    hop_mix: probabilities of 2, 3 and 4 hops (normalised).
    comparison_frac: probability that a question is a comparison (else a chain).
    director_frac: share of people who direct films.
    writer_frac: share of people who write novels.
    spouse_frac: share of people who are married (pairs).
    educated_frac: share of people with a university.
  """
  num_countries: int = 30
  num_cities: int = 150
  num_people: int = 1000
  num_orgs: int = 240
  num_films: int = 600
  num_books: int = 600
  num_questions: int = 4000
  dev_frac: float = 0.1
  test_frac: float = 0.1
  distractors_per_question: int = 4
  hard_distractor_frac: float = 0.5
  hop_mix: tuple = (0.4, 0.35, 0.25)
  comparison_frac: float = 0.25
  director_frac: float = 0.12
  writer_frac: float = 0.15
  spouse_frac: float = 0.3
  educated_frac: float = 0.4

  def __post_init__(self):
    object.__setattr__(self, "hop_mix", tuple(float(p) for p in self.hop_mix))
    where = "rlrag_jax/data/world.py WorldConfig"
    if len(self.hop_mix) != 3 or min(self.hop_mix) < 0 or sum(self.hop_mix) <= 0:
      raise ValueError(f"{where}.hop_mix: expected 3 non-negative weights for 2, 3 and 4 hops "
                       f"with a positive sum, found {self.hop_mix}")
    for f in ("num_countries", "num_people", "num_orgs", "num_films", "num_books",
              "num_questions"):
      if getattr(self, f) < 1:
        raise ValueError(f"{where}.{f}: expected >= 1, found {getattr(self, f)}")
    if self.num_cities < max(2, self.num_countries):
      raise ValueError(f"{where}.num_cities: expected >= num_countries ({self.num_countries}) "
                       f"and >= 2, found {self.num_cities}")
    if self.num_people < 10:
      raise ValueError(f"{where}.num_people: expected >= 10, found {self.num_people}")
    if self.num_orgs < len(T.ORG_KINDS):
      raise ValueError(f"{where}.num_orgs: expected >= {len(T.ORG_KINDS)} (one per kind), "
                       f"found {self.num_orgs}")
    if self.distractors_per_question < 0:
      raise ValueError(f"{where}.distractors_per_question: expected >= 0, "
                       f"found {self.distractors_per_question}")
    fracs = ("dev_frac", "test_frac", "hard_distractor_frac", "comparison_frac",
             "director_frac", "writer_frac", "spouse_frac", "educated_frac")
    for f in fracs:
      if not 0.0 <= getattr(self, f) <= 1.0:
        raise ValueError(f"{where}.{f}: expected a fraction in [0, 1], found {getattr(self, f)}")
    if self.dev_frac + self.test_frac >= 1.0:
      raise ValueError(f"{where}: dev_frac + test_frac must leave a train split, found "
                       f"{self.dev_frac} + {self.test_frac}")
    if self.director_frac + self.writer_frac > 0.8:
      raise ValueError(f"{where}: director_frac + writer_frac must be <= 0.8, found "
                       f"{self.director_frac} + {self.writer_frac}")


@dataclasses.dataclass(frozen=True)
class Entity:
  """One entity of the world; `id` is also the id of its passage."""
  id: str
  name: str
  type: str           # one of ENTITY_TYPES
  kind: str = ""      # orgs: studio, publisher, university, band, company, newspaper
  aliases: tuple = ()  # answer aliases, canonical name first


@dataclasses.dataclass
class World:
  """A built world: corpus, entities, all triples, and the three question splits."""
  seed: int
  config: WorldConfig
  entities: list      # list[Entity], in passage order
  corpus: list        # list[CorpusRecord], one per entity
  triples: list       # list[Triple], every fact of the corpus, in passage order
  train: list         # list[Example]
  dev: list
  test: list

  def __post_init__(self):
    self._passages = {r.id: r for r in self.corpus}
    self._entities = {e.name: e for e in self.entities}

  def split(self, name: str) -> list:
    if name not in SPLITS:
      raise ValueError(f"World.split: unknown split {name!r}; expected one of {list(SPLITS)}")
    return getattr(self, name)

  def passage(self, pid: str) -> CorpusRecord:
    return self._passages[pid]

  def entity(self, name: str) -> Entity:
    return self._entities[name]

  def save(self, out_dir: Union[str, os.PathLike]) -> pathlib.Path:
    """Writes corpus.jsonl, train/dev/test.jsonl and world.json (seed, config, counts)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "corpus.jsonl", [r.to_dict() for r in self.corpus])
    for s in SPLITS:
      _write_jsonl(out / f"{s}.jsonl", [e.to_dict() for e in self.split(s)])
    info = {"seed": self.seed, "config": dataclasses.asdict(self.config),
            "counts": {"passages": len(self.corpus), **{s: len(self.split(s)) for s in SPLITS}}}
    (out / "world.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return out


def _write_jsonl(path: pathlib.Path, rows: list) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")


def build(seed: int = 0, config: Optional[WorldConfig] = None, **sizes) -> World:
  """Builds the world for `seed`; keyword args override fields of `config` (see WorldConfig).

  Raises:
    TypeError: a keyword that is not a WorldConfig field.
    ValueError: sizes too small to yield `num_questions` distinct questions.
  """
  config = config or WorldConfig()
  unknown = sorted(set(sizes) - {f.name for f in dataclasses.fields(WorldConfig)})
  if unknown:
    raise TypeError(f"rlrag_jax.data.world.build: unknown size(s) {unknown}; expected WorldConfig "
                    f"fields {[f.name for f in dataclasses.fields(WorldConfig)]}")
  if sizes:
    config = dataclasses.replace(config, **sizes)
  return _Builder(int(seed), config).build()


# ----------------------------------------------------------------------------- internals


@dataclasses.dataclass
class _Ent:
  id: str
  name: str
  type: str
  kind: str = ""
  aliases: tuple = ()
  pron: str = "It"
  facts: dict = dataclasses.field(default_factory=dict)   # relation -> tail (str)
  sentences: list = dataclasses.field(default_factory=list)
  triples: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Question:
  template: str
  kind: str
  text: str
  answer: str
  steps: list
  program: list
  gold: list
  triples: list
  key: tuple


class _Names:
  """Fresh capitalised words from syllables; no word is handed out twice."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.used = set()

  def take(self, word: str) -> bool:
    w = word.lower()
    if w in self.used or w in T.REAL_NAMES:
      return False
    self.used.add(w)
    return True

  def word(self, syllables=(2, 2), suffixes=("",)) -> str:
    while True:
      n = self.rng.randint(*syllables)
      w = "".join(self.rng.choice(T.SYLLABLES) for _ in range(n)) + self.rng.choice(suffixes)
      if len(w) >= 4 and self.take(w):
        return w.capitalize()


class _Builder:
  """Builds one world; each stage draws from its own seeded stream."""

  def __init__(self, seed: int, cfg: WorldConfig):
    self.seed, self.cfg = seed, cfg
    self.ents = []             # list[_Ent] in passage order
    self.by_name = {}
    self.by_type = {t: [] for t in ENTITY_TYPES}
    self._title_keys = set()   # titles without a leading "The ", lowercased

  def _rng(self, stage: str) -> random.Random:
    return random.Random(f"rlrag-world/{self.seed}/{stage}")

  def build(self) -> World:
    self._make_entities(self._rng("names"), self._rng("facts"))
    self._render(self._rng("text"))
    questions = self._make_questions(self._rng("questions"))
    examples = self._make_examples(self._rng("contexts"), questions)
    order = list(range(len(examples)))
    self._rng("splits").shuffle(order)
    n_dev = round(len(order) * self.cfg.dev_frac)
    n_test = round(len(order) * self.cfg.test_frac)
    dev, test, train = (sorted(order[:n_dev]), sorted(order[n_dev:n_dev + n_test]),
                        sorted(order[n_dev + n_test:]))
    corpus = [CorpusRecord(id=e.id, title=e.name, text=" ".join(e.sentences),
                           triples=list(e.triples)) for e in self.ents]
    return World(
        seed=self.seed, config=self.cfg,
        entities=[Entity(e.id, e.name, e.type, e.kind, e.aliases) for e in self.ents],
        corpus=corpus, triples=[t for r in corpus for t in r.triples],
        train=[examples[i] for i in train], dev=[examples[i] for i in dev],
        test=[examples[i] for i in test])

  # --------------------------------------------------------------------------- entities

  def _add(self, type_: str, name: str, aliases=(), **kw) -> _Ent:
    e = _Ent(id=f"{type_}-{len(self.by_type[type_]):04d}", name=name, type=type_,
             aliases=tuple(dict.fromkeys((name,) + tuple(aliases))), **kw)
    if name in self.by_name:
      raise AssertionError(f"world: duplicate entity name {name!r}")
    self.ents.append(e)
    self.by_name[name] = e
    self.by_type[type_].append(e)
    return e

  def _make_entities(self, nr: random.Random, fr: random.Random) -> None:
    cfg, names = self.cfg, _Names(nr)
    continents = [names.word() for _ in range(3)]
    languages = [names.word((1, 2), T.LANGUAGE_SUFFIXES) for _ in range(max(3, cfg.num_countries
                                                                          // 2))]
    currencies = [names.word((1, 2)).lower() for _ in range(max(3, cfg.num_countries * 2 // 3))]

    countries = []
    for _ in range(cfg.num_countries):
      name = names.word((1, 2), T.COUNTRY_SUFFIXES)
      official = f"{fr.choice(T.COUNTRY_FORMS)} of {name}"
      c = self._add("country", name, aliases=(official,))
      c.facts.update(official_name=official, continent=fr.choice(continents))
      countries.append(c)
    cities = []
    for i in range(cfg.num_cities):
      c = self._add("city", names.word())
      country = countries[i] if i < len(countries) else fr.choice(countries)
      if i < len(countries):
        country.facts["capital"] = c.name
      c.facts.update(located_in=country.name, known_for=fr.choice(T.CITY_KNOWN_FOR))
      cities.append(c)
    for c in countries:
      c.facts.update(language=fr.choice(languages), currency=fr.choice(currencies))

    # People: names first, then roles (directors, novelists, musicians, others).
    firsts = [names.word() for _ in range(max(40, cfg.num_people // 3))]
    surnames = [names.word((2, 3)) for _ in range(max(60, cfg.num_people * 2 // 3))]
    people = []
    for _ in range(cfg.num_people):
      while True:
        full = f"{fr.choice(firsts)} {fr.choice(surnames)}"
        if full not in self.by_name:
          break
      p = self._add("person", full, aliases=(full.split(" ", 1)[1],),
                    pron=fr.choice(("He", "She")))
      people.append(p)
    order = people[:]
    fr.shuffle(order)
    n_dir = max(1, round(cfg.num_people * cfg.director_frac))
    n_wri = max(1, round(cfg.num_people * cfg.writer_frac))
    directors, writers, rest = order[:n_dir], order[n_dir:n_dir + n_wri], order[n_dir + n_wri:]
    kinds = self._org_kind_counts()
    musicians, pos = [], 0      # members of each band, in band order
    for _ in range(kinds["band"]):
      k = min(fr.randint(2, 4), len(rest) - pos)
      musicians.append(rest[pos:pos + k])
      pos += k
    in_band = {p.name for m in musicians for p in m}
    for p in directors:
      self._person(p, fr, "film director", 1880, 1965)
    for p in writers:
      self._person(p, fr, "novelist", 1810, 1970)
    for p in rest:
      if p.name in in_band:
        self._person(p, fr, fr.choice(T.MUSICIAN_OCCUPATIONS), 1930, 1995)
      else:
        self._person(p, fr, fr.choice(T.OTHER_OCCUPATIONS), 1820, 1995)
    for p in people:
      p.facts["born_in"] = fr.choice(cities).name

    # Organisations: kind, base, founder and founding year.
    founders = people[:]
    fr.shuffle(founders)
    n_band = 0
    for kind, _, desc, patterns in T.ORG_KINDS:
      for _ in range(kinds[kind]):
        if kind == "band":
          while True:
            name = f"The {fr.choice(T.ADJECTIVES)} {fr.choice(T.ANIMALS)}"
            if name not in self.by_name:
              break
          o = self._add("org", name, aliases=(name[4:],), kind=kind)
        else:
          word = names.word()
          name = fr.choice(patterns).format(w=word)
          o = self._add("org", name, kind=kind,
                        aliases=(name[4:],) if name.startswith("The ") else ())
        members = musicians[n_band] if kind == "band" else []
        n_band += kind == "band"
        founder = members[0] if members else founders[(len(self.by_type["org"]) - 1)
                                                      % len(founders)]
        age = fr.randint(18, 30) if kind == "band" else fr.randint(22, 55)
        o.facts.update(kind=desc, headquartered_in=fr.choice(cities).name,
                       founded_year=str(min(_LAST_YEAR, int(founder.facts["birth_year"]) + age)),
                       founded_by=founder.name)
        for m in members:
          m.facts["member_of"] = o.name
    orgs = {k: [o for o in self.by_type["org"] if o.kind == k] for k in kinds}

    # Marriages (stated in one spouse's passage) and universities.
    married = fr.sample(people, 2 * (round(cfg.num_people * cfg.spouse_frac) // 2))
    married.sort(key=lambda p: (int(p.facts["birth_year"]), p.id))
    for a, b in zip(married[0::2], married[1::2]):
      head, tail = (a, b) if fr.random() < 0.5 else (b, a)
      head.facts["spouse"] = tail.name
    for p in people:
      if orgs["university"] and fr.random() < cfg.educated_frac:
        p.facts["educated_at"] = fr.choice(orgs["university"]).name

    # Novels, then films (some based on an earlier novel).
    for _ in range(cfg.num_books):
      b = self._add("book", self._title(fr))
      b.aliases = tuple(dict.fromkeys(b.aliases + (_strip_the(b.name),)))
      author = fr.choice(writers)
      b.facts.update(genre=fr.choice(T.NOVEL_GENRES),
                     publication_year=str(min(_LAST_YEAR, int(author.facts["birth_year"])
                                              + fr.randint(22, 70))),
                     written_by=author.name)
      if orgs["publisher"] and fr.random() < 0.8:
        b.facts["published_by"] = fr.choice(orgs["publisher"]).name
    books, adapted = self.by_type["book"], set()
    for _ in range(cfg.num_films):
      f = self._add("film", self._title(fr))
      f.aliases = tuple(dict.fromkeys(f.aliases + (_strip_the(f.name),)))
      director = fr.choice(directors)
      year = min(_LAST_YEAR, int(director.facts["birth_year"]) + fr.randint(25, 55))
      f.facts.update(genre=fr.choice(T.FILM_GENRES), release_year=str(year),
                     directed_by=director.name)
      if orgs["studio"] and fr.random() < 0.7:
        f.facts["produced_by"] = fr.choice(orgs["studio"]).name
      if fr.random() < 0.3:
        for _ in range(10):
          b = fr.choice(books)
          if b.name not in adapted and int(b.facts["publication_year"]) < year:
            adapted.add(b.name)
            f.facts["based_on"] = b.name
            break

  def _org_kind_counts(self) -> dict:
    total = sum(w for _, w, _, _ in T.ORG_KINDS)
    counts = {k: max(1, self.cfg.num_orgs * w // total) for k, w, _, _ in T.ORG_KINDS}
    counts["band"] += self.cfg.num_orgs - sum(counts.values())
    if counts["band"] < 1:
      raise ValueError(f"rlrag_jax/data/world.py: num_orgs={self.cfg.num_orgs} is too small to "
                       f"hold every organisation kind")
    return counts

  @staticmethod
  def _person(p: _Ent, fr: random.Random, occupation: str, lo: int, hi: int) -> None:
    p.facts.update(birth_year=str(fr.randint(lo, hi)), occupation=occupation)

  def _title(self, fr: random.Random) -> str:
    while True:
      adj, noun, noun2 = fr.choice(T.ADJECTIVES), fr.choice(T.NOUNS), fr.choice(T.NOUNS)
      if noun == noun2:
        continue
      name = fr.choice(T.TITLE_PATTERNS).format(adj=adj, noun=noun, noun2=noun2)
      key = _strip_the(name).lower()
      if key not in self._title_keys and name not in self.by_name:
        self._title_keys.add(key)
        return name

  # --------------------------------------------------------------------------- passages

  def _render(self, tr: random.Random) -> None:
    for e in self.ents:
      getattr(self, f"_render_{e.type}")(e, tr)

  @staticmethod
  def _say(e: _Ent, text: str, *relations: str) -> None:
    e.sentences.append(text)
    e.triples.extend(Triple(e.name, r, e.facts[r]) for r in relations)

  def _render_person(self, e: _Ent, tr: random.Random) -> None:
    f = e.facts
    self._say(e, tr.choice(T.PERSON_INTRO).format(name=e.name, year=f["birth_year"],
                                                  a_occupation=_a(f["occupation"])),
              "birth_year", "occupation")
    self._say(e, tr.choice(T.PERSON_BIRTHPLACE).format(pron=e.pron, city=f["born_in"]),
              "born_in")
    extra = [r for r in ("spouse", "educated_at", "member_of") if r in f]
    clauses = [(r, tr.choice(T.PERSON_CLAUSES[r]).format(tail=f[r])) for r in extra]
    groups = [clauses] if len(clauses) == 2 and tr.random() < 0.5 else [[c] for c in clauses]
    if len(clauses) == 3:
      groups = [clauses[:2], clauses[2:]]
    for g in groups:
      self._say(e, f"{e.pron} " + " and ".join(c for _, c in g) + ".", *[r for r, _ in g])

  def _render_city(self, e: _Ent, tr: random.Random) -> None:
    self._say(e, tr.choice(T.CITY_INTRO).format(name=e.name, country=e.facts["located_in"]),
              "located_in")
    self._say(e, tr.choice(T.CITY_KNOWN).format(known_for=e.facts["known_for"]), "known_for")

  def _render_country(self, e: _Ent, tr: random.Random) -> None:
    f = e.facts
    self._say(e, T.COUNTRY_INTRO.format(name=e.name, official=f["official_name"],
                                        continent=f["continent"]), "official_name", "continent")
    self._say(e, tr.choice(T.COUNTRY_CAPITAL).format(capital=f["capital"]), "capital")
    self._say(e, T.COUNTRY_LANG.format(language=f["language"], currency=f["currency"]),
              "language", "currency")

  def _render_org(self, e: _Ent, tr: random.Random) -> None:
    f = e.facts
    self._say(e, tr.choice(T.ORG_INTRO).format(name=e.name, a_kind=_a(f["kind"]),
                                               city=f["headquartered_in"]),
              "kind", "headquartered_in")
    verb = "formed" if e.kind == "band" else "founded"
    self._say(e, tr.choice(T.ORG_FOUNDED).format(verb=verb, year=f["founded_year"],
                                                 founder=f["founded_by"]),
              "founded_year", "founded_by")

  def _render_film(self, e: _Ent, tr: random.Random) -> None:
    f = e.facts
    self._say(e, tr.choice(T.FILM_INTRO).format(name=e.name, a_genre=_a(f["genre"]),
                                                year=f["release_year"]),
              "genre", "release_year")
    studio = f" and produced by {f['produced_by']}" if "produced_by" in f else ""
    self._say(e, T.FILM_CREDITS.format(director=f["directed_by"], studio=studio), "directed_by",
              *(["produced_by"] if studio else []))
    if "based_on" in f:
      self._say(e, tr.choice(T.FILM_BASIS).format(book=f["based_on"]), "based_on")

  def _render_book(self, e: _Ent, tr: random.Random) -> None:
    f = e.facts
    self._say(e, tr.choice(T.NOVEL_INTRO).format(name=e.name, a_genre=_a(f["genre"]),
                                                 year=f["publication_year"]),
              "genre", "publication_year")
    pub = f" and published by {f['published_by']}" if "published_by" in f else ""
    self._say(e, T.NOVEL_CREDITS.format(author=f["written_by"], publisher=pub), "written_by",
              *(["published_by"] if pub else []))

  # --------------------------------------------------------------------------- questions

  def _make_questions(self, qr: random.Random) -> list:
    cfg = self.cfg
    self._index()
    comparisons = {2: (self._born_first, self._released_first, self._published_first,
                       self._founded_first, self._same_country, self._same_birthplace,
                       self._same_director),
                   3: (self._older_than_director, self._in_birth_country,
                       self._same_birthplace_as_director),
                   4: (self._director_born_first, self._author_born_first,
                       self._same_birth_country, self._directors_same_birthplace)}
    out, texts, keys = [], set(), set()
    draws = misses = 0
    tries, patience = 100, 50   # draws per slot; slots in a row that find nothing new
    while len(out) < cfg.num_questions and misses < patience:
      # The slot's hops and kind are drawn once, so rejections do not skew the mix.
      hops = qr.choices((2, 3, 4), weights=cfg.hop_mix)[0]
      make = (qr.choice(comparisons[hops]) if qr.random() < cfg.comparison_frac
              else functools.partial(self._chain, hops=hops))
      misses += 1
      for _ in range(tries):
        draws += 1
        q = make(qr)
        # A passage read twice would make hops != gold passages; such draws are dropped.
        if q is None or q.text in texts or q.key in keys or len(set(q.gold)) != len(q.gold):
          continue
        texts.add(q.text)
        keys.add(q.key)
        out.append(q)
        misses = 0
        break
    if len(out) < cfg.num_questions:
      raise ValueError(f"rlrag_jax/data/world.py: found only {len(out)} distinct questions of "
                       f"num_questions={cfg.num_questions} ({draws} draws, the last "
                       f"{tries * patience} found nothing new); raise the entity counts "
                       f"(num_people, num_films, ...) or lower num_questions")
    return out

  def _index(self) -> None:
    """Inverted indexes for comparisons and distractors."""
    self.natives, self.cities_in, self.films_by = {}, {}, {}
    self.mentions, self.shares = {}, {}
    for e in self.ents:
      for t in e.triples:
        if t.relation in _ENTITY_RELATIONS:
          self.mentions.setdefault(t.tail, []).append(e.id)
          self.shares.setdefault((t.relation, t.tail), []).append(e.id)
    for p in self.by_type["person"]:
      self.natives.setdefault(p.facts["born_in"], []).append(p)
    for c in self.by_type["city"]:
      self.cities_in.setdefault(c.facts["located_in"], []).append(c)
    for f in self.by_type["film"]:
      self.films_by.setdefault(f.facts["directed_by"], []).append(f)
    self.directors = [self.by_name[d] for d in self.films_by]
    self.ents_by_id = {e.id: e for e in self.ents}

  def _chain(self, qr: random.Random, hops: int) -> Optional[_Question]:
    types = list(_START_WEIGHTS)
    start = qr.choice(self.by_type[qr.choices(types, [_START_WEIGHTS[t] for t in types])[0]])
    rels = self._walk(qr, start, hops, {start.name})
    if rels is None or qr.random() >= _LAST_WEIGHTS.get(rels[-1], 1.0):
      return None
    plan = _Plan(self, qr)
    _, answer = plan.chain(start, rels)
    text = _phrase(qr, start.name, rels)
    if answer in text:
      return None
    return plan.finish("chain/" + "/".join(rels), "bridge" if hops == 2 else "composition",
                       text, answer, ("chain", start.name, tuple(rels)))

  def _walk(self, qr: random.Random, e: _Ent, hops: int, seen: set) -> Optional[list]:
    rels = [r for r in e.facts if r in T.Q and e.facts[r] not in seen]
    if hops == 1:
      return qr.choices(rels, [_LAST_WEIGHTS.get(r, 1.0) for r in rels]) if rels else None
    rels = [r for r in rels if r in _ENTITY_RELATIONS]
    qr.shuffle(rels)
    for r in rels:
      tail = self.by_name[e.facts[r]]
      rest = self._walk(qr, tail, hops - 1, seen | {tail.name})
      if rest is not None:
        return [r] + rest
    return None

  # Comparisons. Each returns a _Question or None (no valid draw; the caller draws again).

  def _pick_pair(self, qr, pool, ok: Callable) -> Optional[tuple]:
    for _ in range(20 if len(pool) >= 2 else 0):
      a, b = qr.sample(pool, 2)
      if ok(a, b):
        return a, b
    return None

  def _earlier_pair(self, qr, name, pool, rel, surnames=False):
    pair = self._pick_pair(qr, pool, lambda a, b: a.facts[rel] != b.facts[rel] and (
        not surnames or a.aliases[-1] != b.aliases[-1]))
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    ra, _ = plan.hop(a.name, a, rel)
    rb, _ = plan.hop(b.name, b, rel)
    q, step = T.CMP[name]
    plan.earlier(step.format(a=a.name, b=b.name, i=ra[1:], j=rb[1:]), ra, rb, a.name, b.name)
    return plan.finish(name, "comparison", q.format(a=a.name, b=b.name), plan.value(-1),
                       (name,) + tuple(sorted((a.name, b.name))))

  def _born_first(self, qr):
    return self._earlier_pair(qr, "born_first", self.by_type["person"], "birth_year", True)

  def _released_first(self, qr):
    return self._earlier_pair(qr, "released_first", self.by_type["film"], "release_year")

  def _published_first(self, qr):
    return self._earlier_pair(qr, "published_first", self.by_type["book"], "publication_year")

  def _founded_first(self, qr):
    return self._earlier_pair(qr, "founded_first", self.by_type["org"], "founded_year")

  def _same_pair(self, qr, name, groups: dict, pool: list, value: Callable) -> Optional[tuple]:
    """Two distinct items with the same value (groups: value -> items) or different values."""
    if qr.random() < 0.5:
      big = [v for v in groups.values() if len(v) >= 2]
      return tuple(qr.sample(qr.choice(big), 2)) if big else None
    return self._pick_pair(qr, pool, lambda a, b: value(a) != value(b))

  def _same_country(self, qr):
    pair = self._same_pair(qr, "same_country", self.cities_in, self.by_type["city"],
                           lambda c: c.facts["located_in"])
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    ra, _ = plan.hop(a.name, a, "located_in")
    rb, _ = plan.hop(b.name, b, "located_in")
    return self._finish_same(plan, "same_country", a.name, b.name, ra, rb)

  def _same_birthplace(self, qr):
    pair = self._same_pair(qr, "same_birthplace", self.natives, self.by_type["person"],
                           lambda p: p.facts["born_in"])
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    ra, _ = plan.hop(a.name, a, "born_in")
    rb, _ = plan.hop(b.name, b, "born_in")
    return self._finish_same(plan, "same_birthplace", a.name, b.name, ra, rb)

  def _same_director(self, qr):
    pair = self._same_pair(qr, "same_director", self.films_by, self.by_type["film"],
                           lambda f: f.facts["directed_by"])
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    ra, _ = plan.hop(a.name, a, "directed_by")
    rb, _ = plan.hop(b.name, b, "directed_by")
    return self._finish_same(plan, "same_director", a.name, b.name, ra, rb)

  def _finish_same(self, plan, name, a, b, ra, rb, key=None):
    q, step = T.CMP[name]
    plan.same(step.format(i=ra[1:], j=rb[1:]), ra, rb)
    return plan.finish(name, "comparison", q.format(a=a, b=b), plan.value(-1),
                       key or (name,) + tuple(sorted((a, b))))

  def _older_than_director(self, qr):
    f = qr.choice(self.by_type["film"])
    d = self.by_name[f.facts["directed_by"]]
    a = qr.choice(self.by_type["person"])
    if a is d or a.facts["birth_year"] == d.facts["birth_year"] or \
        a.aliases[-1] == d.aliases[-1]:
      return None
    plan = _Plan(self, qr)
    rd, _ = plan.hop(f.name, f, "directed_by")
    ryd, _ = plan.hop(rd, d, "birth_year")
    rya, _ = plan.hop(a.name, a, "birth_year")
    q, step = T.CMP["older_than_director"]
    plan.earlier(step.format(a=a.name, b=rd, i=rya[1:], j=ryd[1:]), rya, ryd, a.name, d.name)
    return plan.finish("older_than_director", "comparison", q.format(a=a.name, b=f.name),
                       plan.value(-1), ("older_than_director", a.name, f.name))

  def _in_birth_country(self, qr):
    a = qr.choice(self.by_type["person"])
    home = self.by_name[a.facts["born_in"]]
    country = home.facts["located_in"]
    if qr.random() < 0.5:
      pool = [c for c in self.cities_in[country] if c is not home]
    else:
      pool = [c for c in self.by_type["city"] if c.facts["located_in"] != country]
    if not pool:
      return None
    c = qr.choice(pool)
    plan = _Plan(self, qr)
    r1, _ = plan.hop(a.name, a, "born_in")
    r2, _ = plan.hop(r1, home, "located_in")
    r3, _ = plan.hop(c.name, c, "located_in")
    q, step = T.CMP["in_birth_country"]
    plan.same(step.format(i=r2[1:], j=r3[1:]), r2, r3)
    return plan.finish("in_birth_country", "comparison", q.format(a=c.name, b=a.name),
                       plan.value(-1), ("in_birth_country", c.name, a.name))

  def _same_birthplace_as_director(self, qr):
    f = qr.choice(self.by_type["film"])
    d = self.by_name[f.facts["directed_by"]]
    home = d.facts["born_in"]
    if qr.random() < 0.5:
      pool = [p for p in self.natives[home] if p is not d]
    else:
      pool = [p for p in qr.sample(self.by_type["person"], 8) if p.facts["born_in"] != home]
    if not pool:
      return None
    a = qr.choice(pool)
    plan = _Plan(self, qr)
    r1, _ = plan.hop(f.name, f, "directed_by")
    r2, _ = plan.hop(r1, d, "born_in")
    r3, _ = plan.hop(a.name, a, "born_in")
    return self._finish_same(plan, "same_birthplace_as_director", a.name, f.name, r3, r2,
                             key=("same_birthplace_as_director", a.name, f.name))

  def _via_earlier(self, qr, name, works, rel):
    """Whose <rel-person> was born first, W1 or W2? (4 hops)"""
    pair = self._pick_pair(qr, works, lambda a, b: (
        a.facts[rel] != b.facts[rel] and self.by_name[a.facts[rel]].facts["birth_year"]
        != self.by_name[b.facts[rel]].facts["birth_year"]))
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    r1, _ = plan.hop(a.name, a, rel)
    r2, _ = plan.hop(r1, self.by_name[a.facts[rel]], "birth_year")
    r3, _ = plan.hop(b.name, b, rel)
    r4, _ = plan.hop(r3, self.by_name[b.facts[rel]], "birth_year")
    q, step = T.CMP[name]
    plan.earlier(step.format(a=a.name, b=b.name, i=r2[1:], j=r4[1:]), r2, r4, a.name, b.name)
    return plan.finish(name, "comparison", q.format(a=a.name, b=b.name), plan.value(-1),
                       (name,) + tuple(sorted((a.name, b.name))))

  def _director_born_first(self, qr):
    return self._via_earlier(qr, "director_born_first", self.by_type["film"], "directed_by")

  def _author_born_first(self, qr):
    return self._via_earlier(qr, "author_born_first", self.by_type["book"], "written_by")

  def _same_birth_country(self, qr):
    if qr.random() < 0.5:      # same country, different cities
      homes = [[c for c in v if c.name in self.natives] for v in self.cities_in.values()]
      homes = [h for h in homes if len(h) >= 2]
      if not homes:
        return None
      c1, c2 = qr.sample(qr.choice(homes), 2)
      pair = qr.choice(self.natives[c1.name]), qr.choice(self.natives[c2.name])
    else:
      country = lambda p: self.by_name[p.facts["born_in"]].facts["located_in"]
      pair = self._pick_pair(qr, self.by_type["person"], lambda a, b: country(a) != country(b))
    if pair is None:
      return None
    a, b = pair
    plan = _Plan(self, qr)
    r1, _ = plan.hop(a.name, a, "born_in")
    r2, _ = plan.hop(r1, self.by_name[a.facts["born_in"]], "located_in")
    r3, _ = plan.hop(b.name, b, "born_in")
    r4, _ = plan.hop(r3, self.by_name[b.facts["born_in"]], "located_in")
    return self._finish_same(plan, "same_birth_country", a.name, b.name, r2, r4)

  def _directors_same_birthplace(self, qr):
    if qr.random() < 0.5:
      groups = {}
      for d in self.directors:
        groups.setdefault(d.facts["born_in"], []).append(d)
      big = [v for v in groups.values() if len(v) >= 2]
      if not big:
        return None
      d1, d2 = qr.sample(qr.choice(big), 2)
    else:
      pair = self._pick_pair(qr, self.directors,
                             lambda a, b: a.facts["born_in"] != b.facts["born_in"])
      if pair is None:
        return None
      d1, d2 = pair
    a, b = qr.choice(self.films_by[d1.name]), qr.choice(self.films_by[d2.name])
    plan = _Plan(self, qr)
    r1, _ = plan.hop(a.name, a, "directed_by")
    r2, _ = plan.hop(r1, d1, "born_in")
    r3, _ = plan.hop(b.name, b, "directed_by")
    r4, _ = plan.hop(r3, d2, "born_in")
    return self._finish_same(plan, "directors_same_birthplace", a.name, b.name, r2, r4)

  # --------------------------------------------------------------------------- examples

  def _make_examples(self, cr: random.Random, questions: list) -> list:
    out = []
    for k, q in enumerate(questions):
      ids = q.gold + self._distractors(cr, q.gold)
      cr.shuffle(ids)
      contexts = []
      for pid in ids:
        e = self.ents_by_id[pid]
        contexts.append(Context(id=e.id, title=e.name, text=" ".join(e.sentences),
                                sentences=list(e.sentences), triples=list(e.triples)))
      answer_ent = self.by_name.get(q.answer)
      aliases = answer_ent.aliases if answer_ent else (q.answer,)
      # An alias (other than the answer) that the question itself contains would give credit
      # for copying the question, e.g. a surname shared with a person in the question.
      rest = q.text.replace(q.answer, "\x00")
      answers = [q.answer] + [a for a in aliases[1:] if a not in rest and a != q.answer]
      out.append(Example(
          id=f"world-{k:05d}", question=q.text, answers=answers, contexts=contexts,
          gold_ids=list(q.gold), decomposition=q.steps, hops=len(q.gold), kind=q.kind,
          source="world", triples=q.triples,
          meta={"template": q.template, "program": q.program, "seed": self.seed}))
    return out

  def _distractors(self, cr: random.Random, gold: list) -> list:
    n = self.cfg.distractors_per_question
    if n == 0:
      return []
    taken = set(gold)
    hard = []
    for g in gold:
      e = self.ents_by_id[g]
      hard.extend(self.mentions.get(e.name, ()))
      for t in e.triples:
        if t.relation in _ENTITY_RELATIONS:
          hard.extend(self.shares[(t.relation, t.tail)])
    hard = [h for h in dict.fromkeys(hard) if h not in taken]
    chosen = cr.sample(hard, min(len(hard), round(n * self.cfg.hard_distractor_frac)))
    taken.update(chosen)
    types = [self.ents_by_id[g].type for g in gold]
    for _ in range(50 * n):
      if len(chosen) == n:
        break
      pid = cr.choice(self.by_type[cr.choice(types)]).id
      if pid not in taken:
        taken.add(pid)
        chosen.append(pid)
    while len(chosen) < n and len(taken) < len(self.ents):   # tiny worlds: any passage
      pid = cr.choice(self.ents).id
      if pid not in taken:
        taken.add(pid)
        chosen.append(pid)
    return chosen


class _Plan:
  """Accumulates the decomposition, program, gold ids and path triples of one question."""

  def __init__(self, b: _Builder, qr: random.Random):
    self.b, self.qr = b, qr
    self.steps, self.program, self.gold, self.triples = [], [], [], []

  def value(self, k: int) -> str:
    return self.steps[k].answer

  def hop(self, x: str, head: _Ent, rel: str) -> tuple:
    """Asks for `rel` of `head` (named `x`: its name or '#k'); returns ('#k', tail)."""
    tail = head.facts[rel]
    self.steps.append(Step(question=self.qr.choice(T.Q[rel]).format(x=x), answer=tail,
                           gold_ids=[head.id]))
    self.program.append({"op": "hop", "head": x, "relation": rel})
    self.gold.append(head.id)
    self.triples.append(Triple(head.name, rel, tail))
    return f"#{len(self.steps)}", tail

  def chain(self, start: _Ent, rels: list) -> tuple:
    x, e, tail = start.name, start, None
    for r in rels:
      x, tail = self.hop(x, e, r)
      e = self.b.by_name.get(tail)
    return x, tail

  def _ref(self, ref: str) -> str:
    return self.steps[int(ref[1:]) - 1].answer

  def earlier(self, question: str, ra: str, rb: str, a: str, b: str) -> None:
    answer = a if int(self._ref(ra)) < int(self._ref(rb)) else b
    self.steps.append(Step(question=question, answer=answer, gold_ids=[]))
    self.program.append({"op": "earlier", "args": [ra, rb], "options": [a, b]})

  def same(self, question: str, ra: str, rb: str) -> None:
    answer = "yes" if self._ref(ra) == self._ref(rb) else "no"
    self.steps.append(Step(question=question, answer=answer, gold_ids=[]))
    self.program.append({"op": "same", "args": [ra, rb]})

  def finish(self, template, kind, text, answer, key) -> _Question:
    return _Question(template=template, kind=kind, text=text, answer=answer, steps=self.steps,
                     program=self.program, gold=list(self.gold),
                     triples=self.triples, key=key)


def _phrase(qr: random.Random, start: str, rels: list) -> str:
  """The question asking for the end of the chain `rels` from `start`."""
  x, i, n = start, 0, len(rels)
  while True:
    pair = tuple(rels[i:i + 2])
    if len(pair) == 2 and pair in T.NP_PAIR:
      if i + 2 == n:
        return qr.choice(T.Q_PAIR[pair]).format(x=x)
      x, i = T.NP_PAIR[pair].format(x=x), i + 2
      continue
    if i == n - 1:
      return qr.choice(T.Q[rels[i]]).format(x=x)
    x, i = T.NP[rels[i]].format(x=x), i + 1


def _strip_the(name: str) -> str:
  return name[4:] if name.startswith("The ") else name


def _a(phrase: str) -> str:
  return f"{T.article(phrase)} {phrase}"
