"""What `minillm train-medusa` asks the base model, so that its answers teach the heads.

Medusa heads learn the model's own continuations, so they guess well only in
the kind of text they were trained on: heads trained on Python-manual answers
were right 0.07 of the time on everyday questions. The prompts therefore mix
four kinds of text:

* passages of Python's reference manual (`pydoc_data.topics`, the "calib" half,
  never what `minillm eval ppl` scores) in chat questions;
* short questions about the manual's topic names;
* everyday chat questions (how things work, tips, why questions, how-tos,
  short explanations), built from templates and subjects;
* raw code-completion heads (a signature and a docstring).

None of them is a prompt that `minillm bench spec` or notebook 09 measures, nor
about the same subject (`BENCH_SUBJECTS`; tests/test_spec_medusa.py checks).
"""
from __future__ import annotations

import random

# disjoint from the prompts `minillm bench spec` and notebook 09 measure on (no function trained on is scored)
CODE_HEADS = (
    ("linear_search(items, target)", "Return the first index of target in items, or -1."),
    ("char_histogram(text)", "Return a dict mapping each character of text to its count."),
    ("is_perfect_square(n)", "Return True if n is the square of an integer."),
    ("flatten(nested)", "Flatten a list of lists into one list."),
    ("fibonacci(n)", "Return the n-th Fibonacci number."),
    ("merge_sorted(a, b)", "Merge two sorted lists into one sorted list."),
    ("reverse_words(sentence)", "Return the sentence with its words in reverse order."),
    ("mean_and_std(values)", "Return the mean and the standard deviation of values."),
    ("read_csv_rows(path)", "Read a CSV file and return its rows as lists of strings."),
    ("gcd(a, b)", "Return the greatest common divisor of a and b."),
    ("chunks(items, size)", "Split items into consecutive lists of at most size elements."),
    ("count_vowels(text)", "Return how many vowels text contains."),
    ("transpose(matrix)", "Return the transpose of a matrix given as a list of rows."),
    ("unique_in_order(items)", "Return the items without duplicates, keeping the first occurrence."),
    ("celsius_to_fahrenheit(c)", "Convert a temperature from Celsius to Fahrenheit."),
    ("is_palindrome(text)", "Return True if text reads the same backwards, ignoring case and spaces."),
)
QUESTIONS = (
    "Explain this part of the Python reference in plain words:\n\n{}",
    "Summarize the following passage from the Python manual in a few sentences:\n\n{}",
    "What does this section of the Python documentation say? Give an example.\n\n{}",
)
# short open questions about the manual's topics (their names), for answers in everyday prose
TOPIC_QUESTIONS = (
    "What is {} in Python, and when would I use it?",
    "Explain {} to a beginner in a few sentences.",
    "Why does Python have {}? Answer briefly.",
)

# everyday chat: each template with its own subjects, so every question reads naturally
GENERAL_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Explain how {} works.", (
        "a refrigerator", "a vaccine", "photosynthesis", "a bicycle's gears", "a credit card", "a solar panel",
        "a compass", "a microwave oven", "GPS navigation", "an electric motor", "a thermostat", "a heat pump",
        "the human heart", "a camera lens", "a wind turbine", "a battery", "an elevator", "a search engine")),
    ("Give me three tips for {}.", (
        "learning a new language", "saving money each month", "running a first marathon", "keeping houseplants alive",
        "studying for an exam", "a job interview", "speaking in public", "traveling on a budget", "staying focused at work",
        "making friends in a new city", "growing tomatoes", "taking better photos with a phone", "writing a cover letter",
        "cooking for a large family", "keeping a kitchen clean", "starting to meditate")),
    ("Why do {}?", (
        "cats purr", "leaves change color in autumn", "people get hiccups", "onions make people cry",
        "birds migrate", "people yawn", "bees make honey", "ears pop on an airplane", "dogs wag their tails",
        "stars twinkle", "bread dough rise", "people need vitamins", "metals feel cold to the touch",
        "some people get seasick")),
    ("What is {} and why is it important?", (
        "the Amazon rainforest", "the printing press", "DNA", "the Industrial Revolution", "the ozone layer",
        "democracy", "the water cycle", "biodiversity", "the immune system", "the Silk Road", "the Moon's gravity",
        "compound interest", "the scientific method", "the Great Barrier Reef")),
    ("How do I {}?", (
        "boil an egg", "change a flat tire", "write a good resume", "start a vegetable garden", "make pancakes",
        "clean a cast iron pan", "train a puppy to sit", "tie a tie", "back up the photos on my phone",
        "fix a squeaky door", "brew a good cup of tea", "plan a birthday party", "budget for a holiday",
        "remove a coffee stain")),
    ("What are the benefits of {}?", (
        "drinking enough water", "regular exercise", "reading books", "learning to play an instrument",
        "walking every day", "eating vegetables", "keeping a journal", "volunteering", "cycling to work",
        "learning to swim")),
    ("Describe {} in a few sentences.", (
        "the city of Tokyo", "the Sahara desert", "a typical day of a farmer", "the Roman Empire", "a thunderstorm",
        "the planet Mars", "the life cycle of a butterfly", "a coral reef", "the Olympic Games", "a medieval castle")),
    ("What is the difference between {}?", (
        "weather and climate", "a virus and a bacterium", "a crocodile and an alligator", "baking soda and baking powder",
        "a lake and a sea", "a frog and a toad", "speed and velocity", "a comet and an asteroid",
        "an ocean and a sea", "a moth and a butterfly")),
    ("Write a short {}.", (
        "poem about the ocean", "story about a lost dog who finds its way home", "thank-you note to a teacher",
        "description of a sunset over the mountains", "poem about autumn", "story about a robot learning to paint",
        "letter inviting a friend to dinner", "product description for a water bottle")),
    ("Tell me some interesting facts about {}.", (
        "octopuses", "the human brain", "Mount Everest", "honeybees", "the Pacific Ocean", "elephants",
        "volcanoes", "ancient Egypt", "penguins", "the Moon")),
)
# the subjects of the chat prompts measured by `minillm bench spec` and notebook 09: never trained on
BENCH_SUBJECTS = ("capital", "France", "rainbow", "sleep", "sky")


def general_questions() -> list[str]:
    """Every everyday chat question, templates interleaved so that any prefix mixes them."""
    per = [[tpl.format(s) for s in subjects] for tpl, subjects in GENERAL_QUESTIONS]
    out = []
    for i in range(max(len(p) for p in per)):
        out += [p[i] for p in per if i < len(p)]
    return out


def training_prompts(tokenizer, num_chat_prompts: int, num_topic_questions: int, num_general_questions: int,
                     passage_chars: int, seed: int) -> list[list[int]]:
    """Token ids of every prompt: pydoc passages (calib split), topic questions, everyday chat, code heads."""
    from pydoc_data.topics import topics

    def chat(q: str) -> str:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                 add_generation_prompt=True)
        return q

    names = sorted(topics)
    names = names[len(names) // 2:]  # the calib half: never the text perplexity is scored on
    rng = random.Random(seed)
    texts = []
    for i in range(num_chat_prompts):
        text = topics[names[i % len(names)]].strip()
        start = rng.randrange(max(1, len(text) - passage_chars))
        texts.append(chat(QUESTIONS[i % len(QUESTIONS)].format(text[start : start + passage_chars])))
    for i in range(num_topic_questions):
        topic = names[rng.randrange(len(names))].replace("-", " ")
        texts.append(chat(TOPIC_QUESTIONS[i % len(TOPIC_QUESTIONS)].format(topic)))
    general = general_questions()
    if num_general_questions > len(general):
        raise ValueError(f"{num_general_questions} everyday questions asked for; there are {len(general)}")
    texts += [chat(q) for q in general[:num_general_questions]]
    texts += [f'def {sig}:\n    """{doc}"""\n' for sig, doc in CODE_HEADS]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]
