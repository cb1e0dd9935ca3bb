#!/usr/bin/env python3
"""Regenerate ``kimi_deploy/bench/data/prompts.jsonl``, the kit's natural benchmark prompts.

Every sentence below was written for kimi-deploy (Apache-2.0, like the kit); nothing is
copied from a public dataset. The generator combines hand-written topics, task phrasings,
coding tasks, writing briefs, original passages (for long-context prompts) and a few
multi-turn conversations, with a fixed seed, so the file is reproducible:

    python benchmarks/make_prompts.py            # rewrites the file
    python benchmarks/make_prompts.py --check    # exits 1 if the file is out of date

Natural text matters under speculative decoding: random-token prompts give unrealistic
EAGLE acceptance (a draft model predicts natural text; random tokens it cannot predict, so nearly every draft
is rejected).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "kimi_deploy" / "bench" / "data" / "prompts.jsonl"

TOPICS = [
    "photosynthesis", "TCP congestion control", "the Roman Republic", "compound interest", "plate tectonics",
    "the immune system", "public-key cryptography", "the French Revolution", "black holes", "supply and demand",
    "the water cycle", "garbage collection in programming languages", "the printing press", "vaccination",
    "database indexing", "the Silk Road", "climate feedback loops", "Bayesian statistics", "the human microbiome",
    "renewable energy storage", "the Industrial Revolution", "neural networks", "coral reef ecosystems",
    "inflation", "the theory of evolution", "quantum entanglement", "urban planning", "the history of jazz",
    "operating system schedulers", "sleep and memory", "the Apollo program", "soil erosion", "game theory",
    "the Byzantine Empire", "container orchestration", "the placebo effect", "ocean currents", "tax policy",
    "the GPS system", "fermentation", "load balancing", "the Renaissance", "volcanoes", "behavioral economics",
]

FORMS = [
    "Explain {t} to a curious high-school student, with one everyday analogy.",
    "What are the three most common misconceptions about {t}, and what is actually true?",
    "Write a five-question quiz about {t}, with the answers at the end.",
    "Summarize the key ideas of {t} in one paragraph.",
    "Compare {t} with {u}. Where do they overlap, and where do they differ?",
    "I have ten minutes before a meeting where {t} will come up. Give me the essentials as bullet points.",
    "How would you teach {t} in a 45-minute lesson? Outline the plan minute by minute.",
    "What open questions remain about {t}? List a few and say why each is hard.",
    "Give a short history of {t}: the main turning points and the people involved.",
    "Why does {t} matter to someone who never studied it? Answer in plain language.",
    "Write a dialogue between a skeptic and an expert discussing {t}.",
    "What is {t}?",
    "Describe a simple experiment or exercise that demonstrates {t}.",
    "List the five most important terms related to {t} and define each in one sentence.",
]

LANGS = ["Python", "Rust", "Go", "TypeScript", "C++", "Java", "SQL", "Bash"]
CODE_TASKS = [
    "parses an ISO 8601 timestamp and returns the number of seconds since the Unix epoch",
    "merges overlapping intervals in a list of (start, end) pairs",
    "implements a least-recently-used cache with a fixed capacity",
    "reads a CSV file and prints the average of each numeric column",
    "checks whether a string of brackets is balanced",
    "computes the Levenshtein distance between two strings",
    "retries an HTTP request with exponential backoff and jitter",
    "finds the shortest path in a weighted graph with Dijkstra's algorithm",
    "validates an email address without using a regular expression library",
    "splits a large file into chunks of at most N bytes without breaking lines",
    "implements a token bucket rate limiter",
    "serializes a binary tree to a string and back",
    "counts word frequencies in a text and returns the ten most common words",
    "rotates a square matrix by 90 degrees in place",
    "detects a cycle in a linked list",
    "converts a Roman numeral to an integer and back",
    "computes a running median over a stream of numbers",
    "walks a directory tree and reports the total size per file extension",
]
CODE_FORMS = [
    "Write a {lang} function that {task}. Include a few tests.",
    "In {lang}, how would you write code that {task}? Explain the edge cases.",
    "Review this plan: a {lang} module that {task}. What could go wrong, and how would you structure it?",
    "Write idiomatic {lang} that {task}, then explain its time and space complexity.",
]

WRITING = [
    "Write a short story of about 300 words about a lighthouse keeper who receives a letter from the future.",
    "Write a polite but firm email to a landlord about a heating system that has been broken for two weeks.",
    "Write a haiku sequence (five haiku) about a city waking up.",
    "Draft a product description for a reusable water bottle that keeps drinks cold for a day.",
    "Write a cover letter for a junior data analyst position at a public library.",
    "Write a limerick about a cat who learns to use a keyboard.",
    "Write the opening paragraph of a mystery novel set on a night train.",
    "Write a speech of about 200 words for a retiring teacher's farewell party.",
    "Write a recipe for a vegetarian chili that serves six, with a shopping list.",
    "Write a sonnet about the first snow of winter.",
    "Draft a one-page project proposal for a community garden.",
    "Write a bedtime story for a five-year-old about a cloud that is afraid of heights.",
    "Write a short persuasive essay on why cities should plant more trees.",
    "Write an apology message to a friend for missing their birthday dinner.",
    "Write a travel itinerary for three days in a coastal town, with a budget.",
    "Write release notes for version 2.0 of a note-taking app.",
    "Write a job posting for a part-time bicycle mechanic.",
    "Write a motivational message for a team that just missed an important deadline.",
    "Describe a sunset over a desert to someone who has never seen one.",
    "Write a two-minute wedding toast for an old college roommate.",
    "Write a fable with a moral about patience, featuring a tortoise and a crow.",
    "Write a letter to your future self, to be opened in ten years.",
    "Write the script of a 60-second radio advertisement for a neighborhood bakery.",
    "Write a short poem about the sound of rain on a tin roof.",
]

REASONING = [
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey? Show your reasoning.",
    "If three painters paint three rooms in three hours, how long do six painters need for six rooms? Explain.",
    "A shop discounts a jacket by 20% and then by another 15%. What is the total discount? Show the steps.",
    "Is it possible to tile an 8x8 board with two opposite corners removed using 2x1 dominoes? Prove your answer.",
    "A bat and a ball cost 1.10 in total, and the bat costs 1.00 more than the ball. How much is the ball?",
    "How many times a day do the hour and minute hands of a clock overlap? Explain how you count.",
    "You have two ropes that each burn for an hour, unevenly. How do you measure 45 minutes?",
    "What is the sum of the integers from 1 to 1000 that are divisible by 3 or 5?",
    "A farmer has 100 meters of fence. What rectangular area can he enclose at most against a long wall?",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long for 100 machines to make 100 widgets?",
    "Estimate how many piano tuners work in a city of two million people. State your assumptions.",
    "Three friends split a bill of 87 with a 15% tip. How much does each pay, rounded to cents?",
    "Explain why the square root of 2 is irrational.",
    "A recipe for 4 uses 300 g of flour. How much flour for 7 people, and how would you round it?",
    "Which is larger, 2 to the power 100 or 10 to the power 30? Explain without a calculator.",
    "Sort these by likely boiling point and explain: water, ethanol, acetone, glycerol.",
]

PASSAGES = [
    "The harbour town of Merrow Point was built on a spit of land between two tidal inlets. For most of the "
    "nineteenth century its economy rested on herring: boats left before dawn, and by noon the quay was lined "
    "with barrels. When the herring moved north in the 1890s, the town tried oysters, then a small shipyard, "
    "and finally tourism, which arrived with the railway in 1903. The old net lofts became boarding houses, "
    "and the smokehouse was turned into a dance hall that still opens every summer.",
    "A cooling system for a small data room has three parts: the units that move heat out of the room, the "
    "airflow design that brings cold air to the server inlets, and the monitoring that warns before things go "
    "wrong. Most failures come from the second part. Blanking panels left out of racks let hot exhaust loop "
    "back to the front; cables piled under a raised floor block the vents. A cheap temperature sensor at the "
    "top of each rack front often tells more than the room thermostat does.",
    "The committee met on Tuesday to review the library renovation. The architect presented two options. The "
    "first keeps the reading room intact and adds a glass annex on the east side for the children's section, "
    "at an estimated cost of 2.4 million. The second moves the children's section to the basement and "
    "restores the original skylights, at 1.9 million, but closes the library for eight months instead of "
    "five. Several members worried about basement flooding; the architect said drainage would be replaced.",
    "Sourdough bread relies on a culture of wild yeast and lactic acid bacteria. The yeast produces carbon "
    "dioxide that raises the dough, while the bacteria produce acids that give the bread its tang and help it "
    "keep longer. A starter is fed with flour and water at regular intervals; a healthy one roughly doubles "
    "within six to eight hours at room temperature. Bakers adjust the flavour by changing the temperature, "
    "the hydration of the starter, and how long the dough ferments in the cold.",
    "When the service began returning errors at 14:05, the on-call engineer first suspected the database, "
    "because latency graphs showed query times climbing. In fact the database was healthy: a configuration "
    "change deployed at 13:58 had lowered the connection pool limit from 200 to 20, and requests were "
    "queueing for a connection. Rolling back the change at 14:31 cleared the queue within two minutes. The "
    "review recommended validating pool limits in the deployment pipeline and alerting on pool wait time.",
    "The migration of the grey heron along the river valley follows the fish rather than the calendar. In "
    "mild winters many birds stay; in hard ones they move toward the coast where the estuary rarely freezes. "
    "Volunteers counting at six stations found that the number of nests rose from 41 to 67 over ten years, "
    "mostly in the alder woods near the old mill, where felling stopped after the land became a reserve.",
    "Our team's quarterly plan has three goals. First, reduce the time to onboard a new customer from ten "
    "days to five by automating account setup. Second, cut the support backlog in half by adding a searchable "
    "help centre and triaging tickets daily. Third, ship the reporting dashboard that customers have asked for "
    "since spring. Risks: the automation depends on an API the billing team has not finished, and two "
    "engineers are on leave in the second month.",
    "A heat pump moves heat instead of making it. In winter it pulls warmth from outdoor air, even cold air, "
    "and concentrates it with a compressor; in summer it runs in reverse. Its efficiency is expressed as a "
    "coefficient of performance: a value of three means three units of heat delivered for each unit of "
    "electricity. The coefficient falls as the outdoor temperature drops, which is why installers size the "
    "system for the coldest week of a typical year and check the insulation of the house first.",
    "The village council has received complaints about speeding on the main road past the school. A traffic "
    "survey last month measured an average speed of 38 km/h in a 30 km/h zone, with one car in five above "
    "45 km/h during school hours. Options discussed include speed cushions, a narrowed carriageway with "
    "planters, a flashing sign, and asking the police for occasional checks. Residents of the side streets "
    "fear that cushions would push traffic onto their roads.",
    "Learning a second language as an adult is slower than as a child in pronunciation, but adults often "
    "learn vocabulary and grammar faster at first, because they can use explicit rules and memory strategies. "
    "Studies of learners suggest that regular short practice beats occasional long sessions, that speaking "
    "with others matters more than perfect accuracy, and that reading material slightly above one's level "
    "builds vocabulary steadily.",
]
PASSAGE_TASKS = [
    "Summarize the text above in three sentences.",
    "List every number mentioned in the text above and what it refers to.",
    "Write five questions a reader could answer from the text above, with the answers.",
    "What are the main risks or problems described above? Rank them and explain.",
    "Rewrite the text above for a ten-year-old reader.",
    "Extract the key facts from the text above as a bulleted list, one fact per bullet.",
    "Translate the first paragraph above into French, then summarize the rest in English.",
    "Write a headline and a two-sentence teaser for each paragraph above.",
]

SYSTEMS = [
    "You are a concise assistant. Answer in at most five sentences.",
    "You are a patient tutor. Ask a question back when the student's request is unclear.",
    "You are a senior software engineer reviewing code for a colleague.",
    "You are a helpful assistant for a public library's website.",
]
CONVERSATIONS = [
    [("user", "I want to start running but I get bored quickly. Any ideas?"),
     ("assistant", "Try varying routes, running with a friend, or following an interval plan so each run has a goal."),
     ("user", "Intervals sound good. Can you give me a four-week plan for three runs a week?")],
    [("user", "What's the difference between a list and a tuple in Python?"),
     ("assistant", "Lists are mutable and tuples are immutable; tuples can be dictionary keys, lists cannot."),
     ("user", "So when would I choose a tuple in practice? Give examples.")],
    [("user", "I'm planning a dinner for eight people, two of them vegan."),
     ("assistant", "A shared menu that is vegan by default, with optional additions, keeps it simple."),
     ("user", "Suggest a three-course menu along those lines and a timeline for cooking it.")],
    [("user", "My tomato plants have yellow leaves at the bottom."),
     ("assistant", "Lower yellow leaves often mean nitrogen deficiency, overwatering, or early blight."),
     ("user", "How can I tell which one it is, and what should I do for each?")],
    [("user", "Can you help me write a commit message?"),
     ("assistant", "Of course. What did the change do, and why was it needed?"),
     ("user", "It adds a retry with backoff when the payment API times out, because customers were charged twice.")],
    [("user", "Explain recursion."),
     ("assistant", "Recursion is when a function solves a problem by calling itself on a smaller piece of it."),
     ("user", "Show me with factorial, then explain what a stack overflow is.")],
    [("user", "I have a job interview for a project manager role next week."),
     ("assistant", "Congratulations! Do you know the format: panel, one-to-one, or a case exercise?"),
     ("user", "A panel with a case exercise. How should I prepare, day by day?")],
    [("user", "Which is better for a beginner, a film camera or a digital one?"),
     ("assistant", "Digital gives instant feedback and costs nothing per shot; film teaches you to slow down."),
     ("user", "I like slowing down. What film camera and film would you recommend to start with?")],
]


def generate(seed: int = 7) -> list[dict]:
    """All prompts, in a seeded order (``{"messages": [...]}`` dicts)."""
    rng = random.Random(seed)
    prompts: list[list[dict]] = []
    for t in TOPICS:
        for form in rng.sample(FORMS, 3):
            u = rng.choice([x for x in TOPICS if x != t])
            prompts.append([{"role": "user", "content": form.format(t=t, u=u)}])
    for task in CODE_TASKS:
        for lang in rng.sample(LANGS, 3):
            prompts.append([{"role": "user", "content": rng.choice(CODE_FORMS).format(lang=lang, task=task)}])
    prompts += [[{"role": "user", "content": w}] for w in WRITING]
    prompts += [[{"role": "user", "content": r}] for r in REASONING]
    for i in range(48):
        k = rng.choice([1, 2, 3, 5, 8, 10])
        text = "\n\n".join(rng.sample(PASSAGES, k))
        prompts.append([{"role": "user", "content": f"{text}\n\n{rng.choice(PASSAGE_TASKS)}"}])
    for conv in CONVERSATIONS:
        for system in rng.sample(SYSTEMS, 2):
            prompts.append([{"role": "system", "content": system}]
                           + [{"role": r, "content": c} for r, c in conv])
    rng.shuffle(prompts)
    return [{"messages": m} for m in prompts]


def render() -> str:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in generate())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the shipped file differs")
    ns = ap.parse_args()
    text = render()
    if ns.check:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    lens = sorted(len(json.dumps(p)) for p in generate())
    print(f"wrote {OUT}: {len(lens)} prompts, {lens[0]}..{lens[-1]} characters (median {lens[len(lens) // 2]})")


if __name__ == "__main__":
    main()
