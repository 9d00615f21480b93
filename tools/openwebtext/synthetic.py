"""Generated corpora for tests, the benchmark and the README demo (no downloads).

Documents are random English-word prose (langdetect reads them as English), each with
a few invented proper names so that distinct documents share few character 5-grams, as
distinct web pages do. On top of that the generators plant what the pipeline must catch:
near-duplicates (a few words edited), foreign-language pages, mojibake, short pages,
blacklisted and malformed URLs, malformed JSON lines, and task text pasted into
training documents.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

ENGLISH = """
the of and to in a is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their been has when who will
more no if out so said what up its about into than them can only other new some could
time these two may then do first any my now such like our over man me even most made
after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see
men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three small
house water city country family school student group problem fact hand part place case
week company system program question government number night point home room mother area
money story month lot book eye job word business issue side kind head service friend
father power hour game line end member law car name president team minute idea kid body
information back parent face others level office door health person art war history
party result change morning reason research girl guy moment air teacher force education
foot boy age policy music market sense nation plan college interest death experience
effect class control care field development role effort rate heart drug show leader light
voice wife police mind price report decision son view relationship town road arm
difference value building action model season society tax director position player record
paper space ground form event official matter center couple site project activity star
table need court oil situation cost industry figure street image phone data picture
practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window
evidence population truth song energy plant river garden village bridge harbor mountain
island forest valley coast weather winter summer spring autumn kitchen bread coffee letter
engine train station ticket market bank museum library theater church castle farm horse
simple early young important public bad able large national free real full special easy
clear recent certain personal open red difficult available likely short single medical
current wrong private past foreign fine common poor natural significant similar hot dead
central happy serious ready simple left physical general environmental financial blue
democratic dark various entire close legal religious cold final main green nice huge
popular traditional cultural quiet bright heavy gentle narrow ancient modern wooden silver
golden sudden careful strange familiar distant proud honest brave calm eager patient
want give use find tell ask seem feel try leave call keep let begin help talk turn start
might show hear play run move live believe hold bring happen write provide sit stand lose
pay meet include continue set learn lead understand watch follow stop create speak read
allow add spend grow open walk win offer remember consider appear buy wait serve die send
expect build stay fall cut reach kill remain suggest raise pass sell require decide return
explain hope develop carry break receive agree support hit produce eat cover catch draw
choose wonder travel repair borrow collect describe measure prepare protect discover
always often sometimes usually really quickly slowly finally simply nearly almost perhaps
together already again later soon once yesterday tomorrow tonight everywhere somewhere
""".split()

GERMAN = """
der die das und ist nicht ein eine ich sie wir mit auf für von zu dem den sich des auch
es an werden aus er hat dass ihr wie bei oder nach noch nur vor zur bis mehr durch über
sehr schon wenn jetzt immer heute morgen wieder unser haben sein können müssen sollen
gehen kommen machen sagen sehen wissen Haus Stadt Wasser Jahr Zeit Leben Arbeit Schule
Freund Familie Frage Geld Buch Straße Welt Abend Woche gut groß klein neu alt lang
""".split()

FRENCH = """
le la les et est une un des du de dans pour pas que qui sur avec au il elle nous vous
ils sont mais plus par ce cette ces tout comme bien aussi très encore toujours jamais
avoir être faire aller venir voir savoir pouvoir vouloir dire maison ville eau année
temps vie travail école ami famille question argent livre rue monde soir semaine bon
grand petit nouveau vieux long beaucoup peu avant après depuis pendant quand où
""".split()

SPANISH = """
el la los las y es una un del de en para no que por con se su al lo como más pero sus
le ya muy también hasta desde porque cuando donde siempre nunca ahora tener ser hacer
poder decir ir ver dar saber querer llegar pasar deber casa ciudad agua año tiempo vida
trabajo escuela amigo familia pregunta dinero libro calle mundo noche semana bueno grande
pequeño nuevo viejo largo mucho poco antes después
""".split()

FOREIGN = {"de": GERMAN, "fr": FRENCH, "es": SPANISH}

_SYLLABLES = "ka lo ri ven tor mal bre sin dra gul fen hol ast mir pe qua zen lur bo tik".split()
_SITES = ["northgazette.example", "river-times.example", "openbooks.example", "dailyfield.example",
          "harborpost.example", "greenvalley.example", "citylights.example", "techbeat.example"]

# Accented words whose UTF-8 bytes, misread as cp1252, give the classic "cafÃ©" mojibake.
ACCENTED = ["café", "naïve", "résumé", "façade", "déjà", "fiancée", "jalapeño", "entrée"]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def english_words(rng: random.Random, n: int, names: list[str]) -> list[str]:
    """n words: common English words, about 1 in 12 replaced by a document-specific name."""
    out = []
    for _ in range(n):
        if names and rng.random() < 1 / 12:
            out.append(rng.choice(names))
        else:
            # rank^-0.7 style skew: low-index (function) words are drawn more often
            out.append(ENGLISH[int(len(ENGLISH) * rng.random() ** 2.2)])
    return out


def as_prose(words: list[str], rng: random.Random) -> str:
    """Join words into sentences of 6-18 words with capitals and full stops."""
    sentences, i = [], 0
    while i < len(words):
        k = rng.randint(6, 18)
        chunk = words[i:i + k]
        sentences.append(" ".join([chunk[0].capitalize()] + chunk[1:]) + ".")
        i += k
    return " ".join(sentences)


def english_document(rng: random.Random, n_words: int) -> str:
    names = [_name(rng) for _ in range(6)]
    return as_prose(english_words(rng, n_words, names), rng)


def foreign_document(rng: random.Random, lang: str, n_words: int) -> str:
    vocab = FOREIGN[lang]
    return as_prose([rng.choice(vocab) for _ in range(n_words)], rng)


def near_duplicate(text: str, rng: random.Random, n_edits: int) -> str:
    """Replace ``n_edits`` random words of ``text`` with other English words."""
    words = text.split(" ")
    for pos in rng.sample(range(len(words)), min(n_edits, len(words))):
        words[pos] = rng.choice(ENGLISH)
    return " ".join(words)


def mojibake(text: str) -> str:
    """UTF-8 bytes decoded as cp1252: what ftfy exists to undo."""
    return text.encode("utf-8").decode("cp1252", errors="replace")


def url_for(rng: random.Random, i: int) -> str:
    return f"https://{rng.choice(_SITES)}/articles/{i:06d}-{_name(rng).lower()}.html"


@dataclass
class DedupCorpus:
    docs: list  # [{"text", "url"}], in file order
    planted: list  # (original index, near-duplicate index) pairs
    n_edits: list = field(default_factory=list)  # edits made for each planted pair


def make_dedup_corpus(n_distinct: int, n_dups: int, seed: int = 0, min_words: int = 150,
                      max_words: int = 350, max_edits: int = 4) -> DedupCorpus:
    """``n_distinct`` unrelated documents plus ``n_dups`` near-duplicates of random ones
    (1..max_edits words changed), shuffled together so copies are not adjacent."""
    rng = random.Random(seed)
    texts = [english_document(rng, rng.randint(min_words, max_words)) for _ in range(n_distinct)]
    origin = list(range(n_distinct))
    edits = []
    for _ in range(n_dups):
        src = rng.randrange(n_distinct)
        k = rng.randint(1, max_edits)
        texts.append(near_duplicate(texts[src], rng, k))
        origin.append(src)
        edits.append(k)
    order = list(range(len(texts)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    docs = [{"text": texts[old], "url": url_for(rng, new)} for new, old in enumerate(order)]
    planted = [(position[origin[j]], position[j]) for j in range(n_distinct, len(texts))]
    planted = [tuple(sorted(p)) for p in planted]
    return DedupCorpus(docs, planted, edits)
