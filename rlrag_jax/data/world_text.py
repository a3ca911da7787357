"""Word lists and sentence templates of the embedded world (`rlrag_jax.data.world`).

Kept apart from the generator so the wording can be read (and changed) in one place. Names are
made from the syllables below, never taken from a list of real names; `REAL_NAMES` is a small
guard against the few real place names the syllables could spell by chance.

Templates use `str.format` fields: `{x}` is the subject (a name, a '#k' reference or a nested
noun phrase), other fields are named after what they hold.
"""
from __future__ import annotations

# ----------------------------------------------------------------------------- names

SYLLABLES = (
    "ab", "ar", "bel", "bra", "cor", "dal", "dra", "el", "en", "fal", "fen", "gar", "gil", "hal",
    "hesk", "il", "ior", "jar", "kal", "kel", "kor", "lan", "lir", "lum", "mav", "mir", "mor",
    "nal", "nek", "nor", "oth", "pel", "quo", "ras", "rek", "ril", "rum", "sal", "sev", "sil",
    "tam", "tar", "tesk", "thal", "tor", "ul", "var", "vel", "ven", "vor", "wen", "xal", "yor",
    "zan", "zel", "zor", "bri", "cyr", "dun", "esk", "fir", "gwen", "hax", "isk", "jun", "kyr",
    "lod", "myr", "nix", "ost", "pry", "quil", "rhu", "syl", "tyv", "urm", "vyn", "wyr", "yss",
    "zeph")
COUNTRY_SUFFIXES = ("ia", "ovia", "esh", "ara", "und", "istan")
LANGUAGE_SUFFIXES = ("ic", "ish", "ese", "i")
# Real places and people the syllables could spell; generated words equal to one are redrawn.
REAL_NAMES = frozenset("""
  abel aral argentina armenia bali belarus berlin bern bolivia borneo bosnia bristol cairo
  carmen colombia cyprus dallas delhi dublin elgar ellen elmira eden galway gambia ghana
  helen iran iraq irish israel italia jordan kabul kenya korea korean lebanon liberia lima
  lisbon malta marcel maria mali melbourne mira miranda monaco mongolia moravia morocco nigeria
  norway oman oslo paris persia peru rabat riga salem salvador samara serbia seville silvia
  siberia somalia sudan syria tampa taranto tirana toronto tunisia turin urmia valencia varna
  venice victoria yemen zambia zaragoza zurich
""".split())

COUNTRY_FORMS = ("Republic", "Kingdom", "Federation", "Commonwealth", "Grand Duchy")

# ----------------------------------------------------------------------------- English words

ADJECTIVES = (
    "Silent", "Golden", "Hidden", "Broken", "Distant", "Crimson", "Hollow", "Quiet", "Burning",
    "Frozen", "Endless", "Lost", "Wandering", "Bitter", "Silver", "Last", "Northern", "Painted",
    "Sleeping", "Velvet", "Iron", "Paper", "Winter", "Summer", "Autumn", "Secret", "Second",
    "Fallen", "Restless", "Pale", "Scarlet", "Amber", "Glass", "Stone", "Midnight", "Narrow",
    "Open", "Empty", "Gentle", "Wild")
NOUNS = (
    "Harbour", "Garden", "River", "Mirror", "Lantern", "Orchard", "Bridge", "Road", "Tower",
    "Letter", "Island", "Window", "Voyage", "Harvest", "Shadow", "Crown", "Meadow", "Compass",
    "Station", "Field", "Forest", "Mountain", "Valley", "House", "Shore", "Journey", "Promise",
    "Season", "Song", "Tide", "Door", "Path", "Fire", "Storm", "Clock", "Map", "Theatre", "Hotel",
    "Castle", "Coast", "Market", "Chapel", "Canal", "Summit", "Lighthouse", "Archive", "Carnival",
    "Circle", "Machine", "Kingdom")
ANIMALS = (
    "Owls", "Foxes", "Herons", "Wolves", "Ravens", "Hares", "Falcons", "Badgers", "Sparrows",
    "Otters", "Lynxes", "Cranes", "Beetles", "Moths", "Stags", "Finches", "Swans", "Vipers",
    "Bisons", "Wrens")
# Title patterns of films and novels; each title is unique without its leading "The ".
TITLE_PATTERNS = ("The {adj} {noun}", "{noun} of the {adj} {noun2}", "The {noun} and the {noun2}")

FILM_GENRES = ("drama", "comedy", "thriller", "western", "war", "mystery", "romance", "musical",
               "horror", "adventure")
NOVEL_GENRES = ("historical", "crime", "fantasy", "romance", "adventure", "mystery", "satirical",
                "science fiction", "gothic", "family")
CITY_KNOWN_FOR = (
    "glassworks", "harbour", "salt mines", "textile mills", "old cathedral", "spring fair",
    "stone bridges", "observatory", "wine cellars", "clock tower", "fishing fleet", "paper mills",
    "botanical garden", "lace makers", "copper mines", "river port")
OTHER_OCCUPATIONS = (
    "painter", "physicist", "architect", "composer", "politician", "engineer", "historian",
    "chemist", "sculptor", "diplomat", "journalist", "mathematician", "actor", "photographer",
    "economist")
MUSICIAN_OCCUPATIONS = ("musician", "singer", "guitarist", "drummer")

# Organisation kinds: (kind, weight, description in the passage, name patterns).
ORG_KINDS = (
    ("studio", 4, "film studio", ("{w} Pictures", "{w} Films", "{w} Studios")),
    ("publisher", 4, "publishing house", ("{w} Press", "{w} House", "{w} Books")),
    ("university", 4, "university", ("{w} University", "University of {w}", "{w} Institute")),
    ("band", 6, "band", ()),                      # named "The <adjective> <animals>"
    ("company", 4, "company", ("{w} Industries", "{w} Motors", "{w} Mining", "{w} Foods")),
    ("newspaper", 2, "newspaper", ("The {w} Herald", "The {w} Courier", "The {w} Gazette")),
)

# ----------------------------------------------------------------------------- passages
# Each clause states the facts in its comment; a sentence holds at most two facts.

PERSON_INTRO = ("{name} (born {year}) is {a_occupation}.",          # birth_year, occupation
                "{name} is {a_occupation} born in {year}.")
PERSON_BIRTHPLACE = ("{pron} was born in {city}.", "{pron} is a native of {city}.",
                     "{pron} was born and raised in {city}.")       # born_in
PERSON_CLAUSES = {                                                  # one fact each
    "spouse": ("is married to {tail}", "married {tail}"),
    "educated_at": ("studied at {tail}", "graduated from {tail}"),
    "member_of": ("is a member of {tail}", "plays in {tail}"),
}
CITY_INTRO = ("{name} is a city in {country}.", "{name} is a city located in {country}.")
CITY_KNOWN = ("It is known for its {known_for}.", "The city is famous for its {known_for}.")
COUNTRY_INTRO = "{name}, officially the {official}, is a country in {continent}."
COUNTRY_CAPITAL = ("Its capital is {capital}.", "The capital of the country is {capital}.")
COUNTRY_LANG = "Its official language is {language} and its currency is the {currency}."
ORG_INTRO = ("{name} is {a_kind} based in {city}.", "{name} is {a_kind} headquartered in {city}.")
ORG_FOUNDED = ("It was {verb} in {year} by {founder}.", "It was {verb} by {founder} in {year}.")
FILM_INTRO = ("{name} is {a_genre} film released in {year}.",
              "{name} is {a_genre} film from {year}.")
FILM_CREDITS = "It was directed by {director}{studio}."           # directed_by [, produced_by]
FILM_BASIS = ("It is based on the novel {book}.", "It is an adaptation of the novel {book}.")
NOVEL_INTRO = ("{name} is {a_genre} novel first published in {year}.",
               "{name} is {a_genre} novel published in {year}.")
NOVEL_CREDITS = "It was written by {author}{publisher}."           # written_by [, published_by]

# ----------------------------------------------------------------------------- questions
# Q[rel]: a question asking for the tail of `rel` about {x}; NP[rel]: a noun phrase naming it.

Q = {
    "born_in": ("Where was {x} born?", "In which city was {x} born?"),
    "birth_year": ("In what year was {x} born?", "When was {x} born?"),
    "spouse": ("Who is {x} married to?", "Who is the spouse of {x}?"),
    "educated_at": ("Where did {x} study?", "Which university did {x} attend?"),
    "member_of": ("Which band is {x} a member of?",),
    "located_in": ("In which country is {x}?", "Which country is {x} in?"),
    "capital": ("What is the capital of {x}?",),
    "language": ("What is the official language of {x}?",),
    "currency": ("What is the currency of {x}?",),
    "headquartered_in": ("In which city is {x} based?", "Where is {x} headquartered?"),
    "founded_by": ("Who founded {x}?",),
    "founded_year": ("In what year was {x} founded?", "When was {x} founded?"),
    "directed_by": ("Who directed {x}?", "Who was the director of {x}?"),
    "produced_by": ("Which studio produced {x}?",),
    "based_on": ("Which novel is {x} based on?",),
    "release_year": ("In what year was {x} released?", "When was {x} released?"),
    "written_by": ("Who wrote {x}?", "Who is the author of {x}?"),
    "published_by": ("Who published {x}?", "Which publisher published {x}?"),
    "publication_year": ("In what year was {x} published?", "When was {x} first published?"),
}
NP = {
    "born_in": "the city where {x} was born",
    "spouse": "the spouse of {x}",
    "educated_at": "the university where {x} studied",
    "member_of": "the band that {x} plays in",
    "located_in": "the country that {x} is in",
    "capital": "the capital of {x}",
    "headquartered_in": "the city where {x} is based",
    "founded_by": "the founder of {x}",
    "directed_by": "the director of {x}",
    "produced_by": "the studio that produced {x}",
    "based_on": "the novel that {x} is based on",
    "written_by": "the author of {x}",
    "published_by": "the publisher of {x}",
}
# Two relations read as one phrase: (born_in, located_in) -> "the country where X was born".
Q_PAIR = {
    ("born_in", "located_in"): ("In which country was {x} born?",),
    ("headquartered_in", "located_in"): ("In which country is {x} based?",),
}
NP_PAIR = {
    ("born_in", "located_in"): "the country where {x} was born",
    ("headquartered_in", "located_in"): "the country where {x} is based",
}

# Comparison questions: (question, final step). The final step compares earlier answers
# '#i' and '#j'; in "born first" steps {a}/{b} name the options ('#1' when an option is itself
# an earlier answer).
CMP = {
    "born_first": ("Who was born first, {a} or {b}?",
                   "Who was born first, {a} (born #{i}) or {b} (born #{j})?"),
    "released_first": ("Which film came out first, {a} or {b}?",
                       "Which film came out first, {a} (#{i}) or {b} (#{j})?"),
    "published_first": ("Which novel was published first, {a} or {b}?",
                        "Which novel was published first, {a} (#{i}) or {b} (#{j})?"),
    "founded_first": ("Which was founded first, {a} or {b}?",
                      "Which was founded first, {a} (#{i}) or {b} (#{j})?"),
    "same_country": ("Are {a} and {b} in the same country?", "Are #{i} and #{j} the same country?"),
    "same_birthplace": ("Were {a} and {b} born in the same city?",
                        "Are #{i} and #{j} the same city?"),
    "same_director": ("Were {a} and {b} directed by the same person?",
                      "Are #{i} and #{j} the same person?"),
    "older_than_director": ("Who was born first, {a} or the director of {b}?",
                            "Who was born first, {a} (born #{i}) or {b} (born #{j})?"),
    "in_birth_country": ("Is {a} in the country where {b} was born?",
                         "Are #{i} and #{j} the same country?"),
    "same_birthplace_as_director": ("Were {a} and the director of {b} born in the same city?",
                                    "Are #{i} and #{j} the same city?"),
    "director_born_first": ("Whose director was born first, {a} or {b}?",
                            "Whose director was born first, {a} (born #{i}) or {b} (born #{j})?"),
    "author_born_first": ("Whose author was born first, {a} or {b}?",
                          "Whose author was born first, {a} (born #{i}) or {b} (born #{j})?"),
    "same_birth_country": ("Were {a} and {b} born in the same country?",
                           "Are #{i} and #{j} the same country?"),
    "directors_same_birthplace": ("Were the directors of {a} and {b} born in the same city?",
                                  "Are #{i} and #{j} the same city?"),
}


def article(word: str) -> str:
  """'a' or 'an' for the word that follows (by its first letter)."""
  return "an" if word[:1].lower() in "aeiou" else "a"
